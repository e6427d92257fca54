"""Privacy through contamination (Hu, Aslett, Dai, Pollock and Roberts, arXiv 2403.07772).

Each record's response is replaced, with public probability p, by a draw from a public
heavy-tailed density g (:func:`contaminate`); inference uses the contaminated likelihood
``(1 - p) f + p g`` (:func:`contaminated_likelihood`) and releases one exact posterior draw
(:func:`sample_contaminated`). Its (epsilon, delta) is *estimated* on synthetic data by the
paper's Algorithm 1 (:func:`estimate_privacy`): an average-case, asymptotic, empirical figure,
kept apart from the certified Gaussian-DP ledger of the penalty algorithm.
:func:`certified_step` combines the two: the penalty step on the contaminated likelihood,
clipped at a bound derived from (p, g, f) (:func:`certified_bound`), with the ledger's
certified guarantee.
"""

from pymc_penalty.contamination.certified import (
    CertifiedBound,
    certified_bound,
    certified_step,
)
from pymc_penalty.contamination.densities import (
    BernoulliContamination,
    ContaminationDensity,
    StudentTContamination,
    TruncatedStudentT,
)
from pymc_penalty.contamination.empirical import (
    EmpiricalPrivacy,
    PrivacyCurve,
    estimate_privacy,
    privacy_curve,
    privacy_on_dataset,
)
from pymc_penalty.contamination.mechanism import contaminate, contaminated_likelihood
from pymc_penalty.contamination.models import (
    ContaminationModel,
    LinearRegression,
    LocationModel,
    LogisticRegression,
    RecordDomain,
)
from pymc_penalty.contamination.release import netcdf_safe, sample_contaminated

__all__ = [
    "BernoulliContamination",
    "CertifiedBound",
    "ContaminationDensity",
    "ContaminationModel",
    "EmpiricalPrivacy",
    "LinearRegression",
    "LocationModel",
    "LogisticRegression",
    "PrivacyCurve",
    "RecordDomain",
    "StudentTContamination",
    "TruncatedStudentT",
    "certified_bound",
    "certified_step",
    "contaminate",
    "contaminated_likelihood",
    "estimate_privacy",
    "netcdf_safe",
    "privacy_curve",
    "privacy_on_dataset",
    "sample_contaminated",
]
