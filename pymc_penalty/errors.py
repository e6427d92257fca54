"""Every public exception and warning of pymc-penalty, in one place.

Modules raise these; users catch them from ``pymc_penalty`` (re-exported there) or from here.
Nothing in this module imports the rest of the package, so every layer may use it. Messages
never carry data values, rows, exact log-likelihoods or (under add/remove-one) ``n``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MembershipWarning",
    "PlanMismatchWarning",
    "ClippingWarning",
    "ScreenRefused",
    "UnevaluableRowsWarning",
    "BudgetExhausted",
    "ConvergenceWarning",
    "DataChangedError",
    "DeclarationMismatchError",
    "DegenerateDeltaWarning",
    "DistributedSamplingError",
    "FrozenChainWarning",
    "InvalidArgumentError",
    "InvalidDataError",
    "LikelihoodEvaluationError",
    "ModelNotPrivateError",
    "NotPrivateWarning",
    "OwnerError",
    "OwnerSideError",
    "PrivacyAccountingError",
    "PrivateSamplingError",
    "RowCouplingError",
    "SamplingInterrupted",
    "ShardError",
    "UnpublishedResultWarning",
    "UtilityWarning",
    "WarmStartRefused",
]


class InvalidArgumentError(ValueError, TypeError):
    """An argument has the wrong type or lies outside its accepted range.

    A subclass of both :class:`ValueError` and :class:`TypeError`, so ``except ValueError``
    written against earlier versions still catches it.
    """


class InvalidDataError(ValueError):
    """No longer raised: kept so that ``except InvalidDataError`` in existing code still runs.

    Data values never cause a refusal (a refusal spends nothing, so it would be a free answer
    about the data; issue 28). Rows the likelihood cannot evaluate are clipped, and
    :func:`pymc_penalty.sample` warns with :class:`~pymc_penalty.UnevaluableRowsWarning` when
    their charged noisy count is far above zero.
    """


class ModelNotPrivateError(ValueError):
    """The model has a feature through which data would reach the chain without noise."""


class RowCouplingError(ValueError):
    """One record moves several datapoints' log-likelihood terms (raised as the gate's error)."""


class LikelihoodEvaluationError(RuntimeError):
    """The compiled likelihood failed; the original message is withheld (it may hold data)."""


class DataChangedError(ValueError):
    """A data container changed shape or dtype after the step's privacy checks ran."""


class DeclarationMismatchError(ValueError):
    """The declared exponential family does not reproduce the model's log-likelihood."""


class DegenerateDeltaWarning(UserWarning):
    """``delta`` is so large that ``epsilon = 0``: the guarantee says nothing."""


class FrozenChainWarning(UserWarning):
    """The calibrated noise is so large that the chain will hardly move."""


class BudgetExhausted(KeyboardInterrupt):
    """Raised inside ``pm.sample`` to stop sampling once the privacy budget is spent.

    A ``KeyboardInterrupt`` subclass, because that is what ``pm.sample`` treats as a request
    to stop and still return the draws so far.
    """


class PrivacyAccountingError(RuntimeError):
    """The composed releases disagree with the ledger: the run must not be published."""


class NotPrivateWarning(UserWarning):
    """The step is configured so that its output carries no privacy guarantee."""


class UnpublishedResultWarning(NotPrivateWarning):
    """``pm.sample``'s result still holds the data until :func:`pymc_penalty.finalize`.

    Raised when a budgeted :class:`PenaltyMetropolis` is constructed. PyMC has no hook that
    runs after sampling, so the ``InferenceData`` it returns keeps ``observed_data``,
    ``constant_data``, ``log_likelihood`` and data-dependent Deterministics, and carries no
    privacy report; only what ``pymc_penalty.finalize(idata, step)`` returns is private.
    :func:`pymc_penalty.sample` finalizes its result itself and does not raise it.
    """


class SamplingInterrupted(KeyboardInterrupt):
    """Sampling was interrupted (Ctrl-C); ``.privacy_report`` holds what had been spent.

    A :class:`KeyboardInterrupt`, so code that stops on Ctrl-C still stops.
    """

    def __init__(self, message: str, privacy_report: dict[str, Any]) -> None:
        super().__init__(message)
        self.privacy_report = privacy_report


class WarmStartRefused(RuntimeError):
    """The ledger refused a warm-start release (the data were not touched for it)."""


class UtilityWarning(UserWarning):
    """The budget forecasts a poor or hopeless posterior (see :func:`forecast_utility`)."""


class ConvergenceWarning(UserWarning):
    """The released chains have not converged (after sampling; see
    :func:`convergence_verdict`). The forecast before sampling warns with
    :class:`~pymc_penalty.UtilityWarning` instead."""


class PrivateSamplingError(RuntimeError):
    """``pm.sample`` failed; ``.privacy_report`` holds what the run had spent by then."""

    def __init__(self, message: str, privacy_report: dict[str, Any]) -> None:
        super().__init__(message)
        self.privacy_report = privacy_report


class OwnerError(RuntimeError):
    """An owner failed, refused or did not answer; names the owner and what was spent."""


class DistributedSamplingError(OwnerError):
    """An owner was lost or refused mid-run; the run stopped.

    Attributes
    ----------
    run : str
        The run id: pass it (with the same ledger paths) to
        :func:`~pymc_penalty.distributed.sample` to resume.
    step : int
        The step id that did not complete.
    privacy_report : dict
        What the driver's ledger committed (the report of the stopped run).
    """

    def __init__(self, message: str, run: str, step: int, privacy_report: dict[str, Any]):
        super().__init__(message)
        self.run = run
        self.step = step
        self.privacy_report = privacy_report


class ShardError(OwnerError):
    """A shard of a sharded run failed, was lost or did not answer; names the shard.

    A subclass of :class:`OwnerError`, so code that catches a lost party of a distributed run
    catches a lost shard too. Nothing of that step was released (the noise is added at the
    driver, once every shard has answered)."""


class OwnerSideError(RuntimeError):
    """An owner refused or failed a request; the message holds no data values."""


class UnevaluableRowsWarning(UserWarning):
    """The released noisy count of rows an observed variable's likelihood cannot evaluate is
    far above zero: a systematic data error (coding, missing values), told from a charged
    release. Such rows are counted as clipped and add nothing to the chain's test."""


class ScreenRefused(RuntimeError):
    """The ledger refused the screen's release (nothing was computed)."""


class PlanMismatchWarning(UserWarning):
    """``pm.sample`` ran another run than the budgeted step's plan.

    Given by :func:`pymc_penalty.finalize`: when chains ran longer than planned (each stopped
    releasing at the plan's length, and every chain is cut to the same length), when chains
    beyond the plan released no draw (removed), and when the run was shorter than planned
    (budget left unspent). It says what was spent and removed.
    """


class ClippingWarning(UserWarning):
    """Many rows were clipped: the chain samples a biased posterior.

    Given by :func:`pymc_penalty.finalize` (and ``pymc_penalty.sample``) when the released
    clipped fraction (``dp_clipped_fraction``, noisy: public) is above 5%. A clip found in
    tuning (``clip="auto"``, the default with a budget) keeps it near 0.2%; a fixed clip
    (``clip=ClipPolicy(1.0, mode="distance")``, the earlier default) can clip a quarter of
    the rows.
    """


class MembershipWarning(UserWarning):
    """No longer issued: kept so that code which filters it keeps working.

    It said that under add/remove-one neighbours without ``min_rows`` a refusal by the model
    gate could depend on the private number of rows (issue 28). ``min_rows``, a public lower
    bound on the rows, is now required under add/remove-one: without it every entry point
    raises :class:`InvalidArgumentError` (naming ``min_rows``, the same for every table)
    before anything is spent, so the case this warned about cannot arise."""
