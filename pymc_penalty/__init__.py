"""pymc-penalty: differentially private Bayesian inference for PyMC (the penalty algorithm)."""

from pymc_penalty import audit, contamination, diagnostics
from pymc_penalty._version import __version__
from pymc_penalty.accounting import expected_acceptance, gdp_epsilon, gdp_mu
from pymc_penalty.api import PrivateSamplingError, finalize, sample
from pymc_penalty.audit import AuditResult, audit_releases, audit_step, audit_warm_start
from pymc_penalty.budget import FrozenChainWarning, PrivacyBudget, RunPlan, calibrate
from pymc_penalty.callback import BudgetExhausted, PrivacyAccountingError, PrivacyCallback
from pymc_penalty.contamination import (
    BernoulliContamination,
    EmpiricalPrivacy,
    StudentTContamination,
    TruncatedStudentT,
    contaminate,
    contaminated_likelihood,
    estimate_privacy,
    privacy_curve,
    sample_contaminated,
)
from pymc_penalty.diagnostics import (
    ConvergenceWarning,
    convergence_verdict,
    epsilon_curve,
)
from pymc_penalty.forecast import UtilityForecast, UtilityWarning, forecast_utility
from pymc_penalty.interrupts import SamplingInterrupted
from pymc_penalty.ledger import PrivacyLedger
from pymc_penalty.model_checks import ModelNotPrivateError
from pymc_penalty.plots import plot_epsilon, plot_privacy
from pymc_penalty.recycling import recycled_mean, recycled_summary, recycled_terms
from pymc_penalty.report import attach_report, build_report
from pymc_penalty.report_view import ReportView, report
from pymc_penalty.step import NotPrivateWarning, PenaltyMetropolis, UnpublishedResultWarning
from pymc_penalty.step_setup import PlanMismatchWarning
from pymc_penalty.validation import InvalidArgumentError, InvalidDataError

__all__ = [
    "AuditResult",
    "BernoulliContamination",
    "BudgetExhausted",
    "EmpiricalPrivacy",
    "FrozenChainWarning",
    "InvalidArgumentError",
    "InvalidDataError",
    "ModelNotPrivateError",
    "NotPrivateWarning",
    "PenaltyMetropolis",
    "PrivacyAccountingError",
    "PrivacyBudget",
    "PrivacyCallback",
    "PrivacyLedger",
    "PrivateSamplingError",
    "ReportView",
    "RunPlan",
    "SamplingInterrupted",
    "StudentTContamination",
    "TruncatedStudentT",
    "PlanMismatchWarning",
    "UnpublishedResultWarning",
    "UtilityForecast",
    "UtilityWarning",
    "ConvergenceWarning",
    "convergence_verdict",
    "__version__",
    "attach_report",
    "audit",
    "audit_releases",
    "audit_step",
    "audit_warm_start",
    "build_report",
    "calibrate",
    "contaminate",
    "contaminated_likelihood",
    "contamination",
    "diagnostics",
    "epsilon_curve",
    "estimate_privacy",
    "expected_acceptance",
    "finalize",
    "forecast_utility",
    "gdp_epsilon",
    "gdp_mu",
    "plot_epsilon",
    "plot_privacy",
    "privacy_curve",
    "recycled_mean",
    "recycled_summary",
    "recycled_terms",
    "report",
    "sample",
    "sample_contaminated",
]
