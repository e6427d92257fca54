"""Data sharing among several owners (Algorithm 2 of the arXiv seed).

The data are split among ``N`` owners; datapoint ``i`` belongs to owner ``owners[i]``. At each
step every owner ``j`` computes its own clipped sum ``d_j = sum_{i in j} clip(r_i, -B, B)``
and releases ``d_hat_j = d_j + N(0, sigma_j^2)`` with its own noise. The acceptance test uses
``sum_j d_hat_j - (sum_j sigma_j^2) / 2``: the sum carries Gaussian noise of known variance
``sum_j sigma_j^2``, symmetric in the two points, so the chain stays exact when clipping is
inactive (at the price of more noise in the test: ``N sigma^2`` for equal ``sigma``).

Privacy, per step, with L2 sensitivity ``Delta`` (``2B`` substitute-one, ``B`` add/remove):

* against another owner, who sees every owner's release, owner ``j``'s data are protected
  by its own noise only: ``mu_j = Delta / sigma_j``;
* against an outsider, who sees only the chain (a function of the sum), a datapoint moves one
  owner's term by at most ``Delta`` under noise of variance ``sum_j sigma_j^2``:
  ``mu_out = Delta / sqrt(sum_j sigma_j^2)``.

The step's ``dp_mu`` statistic (and the ledger charge) is the worst case ``max_j mu_j``, so
the package's ledger, callback and report stay correct; ``dp_mu_owner_<j>`` holds each
``mu_j`` and ``dp_mu_outsider`` the outsider's. :func:`owner_report` composes them into
epsilons. The optional clip count is released in the same way: each owner adds its own noise
to its own count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pymc_penalty.accounting import compose_mu, compose_mu2, composed_epsilon
from pymc_penalty.privacy.mechanism import release_noise
from pymc_penalty.privacy.precision import gaussian_release, snap_count
from pymc_penalty.sampling.kernel import PenaltyState, Release, StepNoise
from pymc_penalty.sampling.step import PenaltyMetropolis

__all__ = ["MultiOwnerPenaltyMetropolis", "owner_report", "validate_owners"]


def validate_owners(owners: Any, n: int | None = None, n_owners: int | None = None) -> np.ndarray:
    """Check an owner-index array and return it as ``int64``.

    Parameters
    ----------
    owners : array_like of int
        Owner index of each datapoint, in ``[0, n_owners)``.
    n : int, optional
        Number of datapoints the array must have.
    n_owners : int, optional
        Number of owners; defaults to ``max(owners) + 1``.

    Raises
    ------
    ValueError
        Naming ``owners`` for a wrong shape or length, a non-integer or negative entry, or an
        index not below ``n_owners``.
    """
    arr = np.asarray(owners)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            "`owners` must be a non-empty 1-D integer array (one index per datapoint)."
        )
    if arr.dtype.kind not in "iu":
        raise ValueError(f"`owners` must hold integers; got dtype {arr.dtype}.")
    if n is not None and arr.shape[0] != n:
        # Lengths are not printed: under add/remove-one neighbours n itself is private.
        raise ValueError("`owners` must have one entry per datapoint; its length differs.")
    if arr.min() < 0:
        raise ValueError("`owners` must be non-negative owner indices.")
    if n_owners is not None and arr.max() >= n_owners:
        raise ValueError(f"`owners` holds index {int(arr.max())} >= n_owners={n_owners}.")
    return arr.astype(np.int64)


class MultiOwnerPenaltyMetropolis(PenaltyMetropolis):
    """:class:`PenaltyMetropolis` with the data split among several owners.

    Parameters
    ----------
    owners : array_like of int
        Owner index (``0 .. N-1``) of each datapoint, in the order of the model's per-datapoint
        log-likelihood vector (observed variables in model order, leading axis).
    n_owners : int, optional
        Number of owners ``N`` (owners without data still add noise). Defaults to
        ``max(owners) + 1``.
    noise_sd : float or array_like, optional
        Each owner's noise sd ``sigma_j``: one value for all owners or one per owner.
    mu : float, optional
        Per-step Gaussian-DP parameter of every owner against the other owners
        (``sigma_j = Delta / mu_ll`` for all ``j``).
    **kwargs
        As :class:`~pymc_penalty.sampling.step.PenaltyMetropolis`.

    Notes
    -----
    Extra statistics: ``dp_mu_owner_0`` .. ``dp_mu_owner_{N-1}`` (each owner's per-step mu
    against the others), ``dp_mu_outsider``. ``dp_mu`` is their maximum, what the ledger charges;
    ``dp_noise_sd`` is the sd of the summed noise, ``sqrt(sum_j sigma_j^2)``.
    """

    name = "multi_owner_penalty_metropolis"
    stats_dtypes_shapes = {
        **PenaltyMetropolis.stats_dtypes_shapes,
        "dp_mu_outsider": (np.float64, []),
    }

    def __init__(
        self,
        vars: list | None = None,
        *,
        owners: Any,
        n_owners: int | None = None,
        noise_sd: Any = None,
        **kwargs: Any,
    ) -> None:
        owners_arr = validate_owners(owners)
        if n_owners is None:
            n_owners = int(owners_arr.max()) + 1
        elif isinstance(n_owners, bool) or not isinstance(n_owners, int | np.integer):
            raise ValueError("`n_owners` must be a positive integer.")
        n_owners = int(n_owners)
        if n_owners < 1:
            raise ValueError("`n_owners` must be a positive integer.")
        owners_arr = validate_owners(owners_arr, n_owners=n_owners)
        owner_sd = None
        if noise_sd is not None:
            sd = np.asarray(noise_sd, dtype=np.float64) if _numeric(noise_sd) else None
            if sd is None or sd.ndim > 1 or (sd.ndim == 1 and sd.shape[0] != n_owners):
                raise ValueError(
                    f"`noise_sd` must be a positive number or one per owner ({n_owners})."
                )
            if not np.all(np.isfinite(sd)) or np.any(sd <= 0.0):
                raise ValueError("`noise_sd` must be finite positive number(s), in (0, inf).")
            owner_sd = np.broadcast_to(sd, (n_owners,)).astype(np.float64)
            noise_sd = float(owner_sd.min())  # the parent validates this one
        # Per-owner clipped sums and clip counts come out of the one compiled call.
        self._segments = (owners_arr, n_owners)
        super().__init__(vars, noise_sd=noise_sd, **kwargs)
        if owners_arr.shape[0] != self._n:
            raise ValueError("`owners` must have one entry per datapoint; its length differs.")
        self.owners = owners_arr
        self.n_owners = n_owners
        self.owner_sizes = np.bincount(owners_arr, minlength=n_owners)
        self._owner_sd = owner_sd
        shapes = dict(self.stats_dtypes_shapes)
        # One scalar statistic per owner: PyMC's NDArray trace stores scalar stats only.
        for j in range(n_owners):
            shapes[_owner_stat(j)] = (np.float64, [])
        self.stats_dtypes_shapes = shapes
        self.stats_dtypes = [{k: v[0] for k, v in shapes.items()}]

    # --- privacy -------------------------------------------------------------------------

    def _owner_noise(self, length: float) -> tuple[Any, ...]:
        """(B, Delta, sigma_j, count sd_j, mu_j against the owners, mu against an outsider)."""
        n_own = self.n_owners
        fixed = self.mu is None
        bound, delta, sigma, count_sd, step_mu = release_noise(
            self.clip,
            self.clip_mode,
            self.neighbours,
            length,
            mu=self.mu,
            noise_sd=self._owner_sd.copy() if fixed else None,
            count_share=self.clip_count_share,
        )
        sigmas, count_sd, mu_owners = (
            np.broadcast_to(v, (n_own,)).astype(float) for v in (sigma, count_sd, step_mu)
        )
        if not math.isfinite(delta):
            return bound, delta, sigmas, count_sd, mu_owners, math.inf
        # The outsider sees the sums: the likelihood release and the count release, each
        # under all owners' noise, composed.
        mu_ll_out = 0.0 if delta == 0.0 else delta / math.sqrt(float(np.sum(sigmas**2)))
        finite = np.all(np.isfinite(count_sd))
        mu_count_out = 1.0 / math.sqrt(float(np.sum(count_sd**2))) if finite else 0.0
        mu_out = compose_mu([mu_ll_out, mu_count_out])
        return bound, delta, sigmas, count_sd, mu_owners, mu_out

    # --- the step: the owners' release, in the one transition of PenaltyMetropolis ------------

    def _step_noise(self, length: float) -> tuple[StepNoise, Callable, None]:
        """The step's noise (summed over the owners) and its release: each owner its own noisy
        clipped sum. The ledger is charged the worst owner's ``mu``."""
        bound, delta, sigmas, count_sd, mu_owners, mu_out = self._owner_noise(length)
        party = (("dp_mu_outsider", mu_out),)
        party += tuple((_owner_stat(j), float(m)) for j, m in enumerate(mu_owners))
        noise = StepNoise.from_var(delta, float(np.sum(sigmas**2)), float(np.max(mu_owners)), party)

        def release(state: PenaltyState, x1: np.ndarray) -> Release:
            return self._release_owner_sums(state, x1, bound, sigmas, count_sd)

        return noise, release, None

    def _release_owner_sums(
        self,
        state: PenaltyState,
        x1: np.ndarray,
        bound: float,
        sigmas: np.ndarray,
        count_sd: np.ndarray,
    ) -> Release:
        """Each owner releases its clipped sum (and clip count) with its own noise, the sum on
        the grid of its noise sd (:mod:`pymc_penalty.privacy.precision`: what leaves an owner
        is never at full precision); the released sums are added."""
        state, proposal, owner_sums, owner_clipped = self._evaluate(state, x1, bound)
        noise = self._noise()
        d_hat = float(np.sum(gaussian_release(owner_sums, sigmas, noise)))
        if not self.private:
            clipped_count = float(owner_clipped.sum())
        elif np.all(np.isfinite(count_sd)):
            noisy = owner_clipped + count_sd * noise.standard_normal(self.n_owners)
            clipped_count = snap_count(float(noisy.sum()))
        else:
            clipped_count = math.nan
        del owner_sums, owner_clipped  # exact values: never to leave this function
        fraction = self._public_fraction(clipped_count, self._n)
        return Release(d_hat, proposal, float(clipped_count), float(fraction), state)


def _owner_stat(j: int) -> str:
    return f"dp_mu_owner_{j}"


def _numeric(value: Any) -> bool:
    try:
        np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return True


def _stat(source: Any, name: str) -> np.ndarray | None:
    if isinstance(source, Mapping):
        return None if name not in source else np.asarray(source[name], dtype=np.float64)
    if name in getattr(source, "data_vars", {}):
        return np.asarray(source[name].values, dtype=np.float64)
    return None


def _owner_mus(source: Any) -> np.ndarray | None:
    """Per-owner mu statistics stacked on a last axis (``dp_mu_owners`` or one per owner)."""
    stacked = _stat(source, "dp_mu_owners")
    if stacked is not None:
        return stacked
    columns = []
    while (col := _stat(source, _owner_stat(len(columns)))) is not None:
        columns.append(col)
    return np.stack(columns, axis=-1) if columns else None


def owner_report(
    idata_or_stats: Any, delta: float, *, allow_missing_tune: bool = False
) -> dict[str, Any]:
    """Each owner's epsilon against the other owners and against an outsider.

    Composes the per-step ``dp_mu_owner_<j>`` and ``dp_mu_outsider`` statistics of every release
    (all chains together, tuning included) as Gaussian DP, ``mu = sqrt(sum_t mu_t^2)``, and
    converts with :func:`~pymc_penalty.accounting.composed_epsilon`.

    Parameters
    ----------
    idata_or_stats : InferenceData, Dataset or mapping
        An ``InferenceData`` from ``pm.sample`` with
        :class:`MultiOwnerPenaltyMetropolis` (its ``warmup_sample_stats`` are included), a
        ``sample_stats``-like Dataset, or a mapping with ``dp_mu_outsider`` and either
        ``dp_mu_owner_0``, ``dp_mu_owner_1``, ... or one array ``dp_mu_owners`` (last axis:
        owner).
    delta : float
        Target ``delta`` in ``(0, 1)``.
    allow_missing_tune : bool, default False
        An InferenceData whose tuning draws were discarded misses releases that were made and
        would understate epsilon; it is refused unless this is True.

    Returns
    -------
    dict
        ``mu_vs_owners`` and ``epsilon_vs_owners`` (one per owner), ``mu_vs_outsider``,
        ``epsilon_vs_outsider``, ``delta`` and ``releases``.
    """
    sources = []
    if hasattr(idata_or_stats, "groups") and callable(idata_or_stats.groups):
        groups = idata_or_stats.groups()
        if "sample_stats" not in groups:
            raise ValueError("The InferenceData has no sample_stats.")
        sources.append(idata_or_stats.sample_stats)
        if "warmup_sample_stats" in groups:
            sources.append(idata_or_stats.warmup_sample_stats)
        else:
            tuning = int(idata_or_stats.sample_stats.attrs.get("tuning_steps", 0) or 0)
            if tuning > 0 and not allow_missing_tune:
                raise ValueError(
                    f"The {tuning} tuning draws per chain were discarded, but their releases "
                    "count: sample with discard_tuned_samples=False (or pass "
                    "allow_missing_tune=True knowingly)."
                )
    else:
        sources.append(idata_or_stats)
    mu2_owners: np.ndarray | None = None
    mu2_out = 0.0
    releases = 0
    for src in sources:
        owners_mu = _owner_mus(src)
        out_mu = _stat(src, "dp_mu_outsider")
        if owners_mu is None or out_mu is None:
            raise ValueError("Statistics `dp_mu_owner_<j>` and `dp_mu_outsider` are required.")
        part = compose_mu2(owners_mu.reshape(-1, owners_mu.shape[-1]), axis=0)
        mu2_owners = part if mu2_owners is None else mu2_owners + part
        mu2_out += compose_mu2(out_mu)
        released = _stat(src, "dp_released")
        releases += int(np.sum(released)) if released is not None else int(out_mu.size)
    return {
        "delta": float(delta),
        "releases": releases,
        "mu_vs_owners": [math.sqrt(m) for m in mu2_owners],
        "epsilon_vs_owners": [composed_epsilon(m, delta) for m in mu2_owners],
        "mu_vs_outsider": math.sqrt(mu2_out),
        "epsilon_vs_outsider": composed_epsilon(mu2_out, delta),
    }
