"""pymc-penalty: differentially private Bayesian inference for PyMC (the penalty algorithm)."""

from pymc_penalty import audit, contamination
from pymc_penalty._version import __version__
from pymc_penalty.accounting import expected_acceptance, gdp_epsilon, gdp_mu
from pymc_penalty.api import finalize, sample
from pymc_penalty.audit import AuditResult, audit_releases, audit_step, audit_warm_start
from pymc_penalty.budgeted import PenaltyMetropolis
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
from pymc_penalty.errors import (
    BudgetExhausted,
    ClippingWarning,
    ConvergenceWarning,
    FrozenChainWarning,
    InvalidArgumentError,
    InvalidDataError,
    MembershipWarning,
    ModelNotPrivateError,
    NotPrivateWarning,
    PlanMismatchWarning,
    PrivacyAccountingError,
    PrivateSamplingError,
    SamplingInterrupted,
    UnevaluableRowsWarning,
    UnpublishedResultWarning,
    UtilityWarning,
)
from pymc_penalty.planning.forecast import UtilityForecast, forecast_utility
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan, calibrate
from pymc_penalty.privacy.callback import PrivacyCallback
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.results import diagnostics
from pymc_penalty.results.diagnostics import convergence_verdict, epsilon_curve
from pymc_penalty.results.plots import plot_epsilon, plot_privacy
from pymc_penalty.results.recycling import recycled_mean, recycled_summary, recycled_terms
from pymc_penalty.results.report import attach_report, build_report
from pymc_penalty.results.view import ReportView, report
from pymc_penalty.sampling.options import ClipPolicy, PrivacyPolicy, ProposalPolicy

__all__ = [
    "AuditResult",
    "BernoulliContamination",
    "BudgetExhausted",
    "ClipPolicy",
    "ClippingWarning",
    "EmpiricalPrivacy",
    "FrozenChainWarning",
    "InvalidArgumentError",
    "InvalidDataError",
    "MembershipWarning",
    "ModelNotPrivateError",
    "NotPrivateWarning",
    "PenaltyMetropolis",
    "PrivacyAccountingError",
    "PrivacyBudget",
    "PrivacyCallback",
    "PrivacyLedger",
    "PrivacyPolicy",
    "PrivateSamplingError",
    "ProposalPolicy",
    "ReportView",
    "RunPlan",
    "SamplingInterrupted",
    "StudentTContamination",
    "TruncatedStudentT",
    "PlanMismatchWarning",
    "UnpublishedResultWarning",
    "UnevaluableRowsWarning",
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
