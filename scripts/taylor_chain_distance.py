"""Where the Taylor path's chains sit against the released model (issue 27 diagnosis).

For each run of ``pp.sample(method="taylor")`` on a model of ``benchmarks/model_suite.py``,
prints public values only (the released model the step was built with, and the released
chains):

- ``|u(mode)|``: the released model's mode (the chains' start) in whitened units from the
  expansion point ``t``;
- ``chains from mode``: each chain's mean, whitened, from that mode (RMS over chains);
- ``H eig``: the three smallest curvatures of the released Hessian ``-H`` (whitened), and the
  floor the released mode search reads any curvature below as (3 noise sds of the spectrum);
- the Hessian clip, the smallest bulk ESS and the verdict.

A chain far from the mode, with a released curvature below the floor in some direction, is
the failure this script was written to see: the chains target the posterior tilted by the
raw released Hessian, which is flatter there than the model the start and the independent
moves come from.

Run ``python scripts/taylor_chain_distance.py --model hierarchical --eps 1 --datasets 0 1 2``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import model_suite as ms  # noqa: E402

import pymc_penalty as pp  # noqa: E402
from pymc_penalty.privacy import taylor as tl  # noqa: E402
from pymc_penalty.results.noise_aware import _forward_fn  # noqa: E402
from pymc_penalty.sampling import taylor as st  # noqa: E402


def run(model_name: str, eps: float, index: int, n: int, seed: int) -> dict:
    """One run's figures (public values)."""
    built: dict = {}
    original = st.TaylorPenaltyMetropolis.__init__

    def keep(self, vars=None, *, taylor, **kwargs):  # the released model the step gets
        built["taylor"] = taylor
        original(self, vars, taylor=taylor, **kwargs)

    st.TaylorPenaltyMetropolis.__init__ = keep
    try:
        model = ms.build_model(ms.make_dataset(model_name, n, index))
        idata = pp.sample(
            epsilon=eps, delta=ms.DELTA, model=model, random_seed=seed, cores=1,
            progressbar=False, method="taylor",
        )  # fmt: skip
    finally:
        st.TaylorPenaltyMetropolis.__init__ = original
    tm = built["taylor"]
    post = idata.posterior_tilted
    # the chains' draws as raveled unconstrained points (model.value_vars' order), mapped by
    # the noise-aware posterior's own forward transform
    forward, _ = _forward_fn(model)
    chains, draws = post.sizes["chain"], post.sizes["draw"]
    flat = [
        post[rv.name].values.reshape(chains * draws, *post[rv.name].shape[2:])
        for rv in model.free_RVs
    ]
    values = forward(*flat)
    x = np.concatenate([np.reshape(v, (chains, draws, -1)) for v in values], axis=-1)
    u_mode = tm.whiten(tm.point)
    from_mode = [float(np.linalg.norm(tm.whiten(c.mean(axis=0)) - u_mode)) for c in x]
    out = {
        "u_mode": float(np.linalg.norm(u_mode)),
        "chains_from_mode": math.sqrt(float(np.mean(np.square(from_mode)))),
        "clip_H": float(tm.clip_H),
        "ess": float(idata.attrs["dp_ess_bulk_min"]),
        "verdict": str(idata.attrs["dp_convergence"]),
    }
    if tm.release.H is not None:
        k = tm.release.H.shape[0]
        curv = np.sort(np.linalg.eigvalsh(-0.5 * (tm.release.H + tm.release.H.T)))
        out["H_eig"] = [float(v) for v in curv[:3]]
        out["floor"] = tl.curvature_floor(tm.release.sd_H, k)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="hierarchical", choices=ms.MODELS)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--datasets", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n", type=float, default=1e4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index in args.datasets:
            r = run(args.model, args.eps, index, int(args.n), args.seed)
            eig = ", ".join(f"{v:.3f}" for v in r.get("H_eig", []))
            print(
                f"{args.model} eps {args.eps:g} data set {index}: |u(mode)| {r['u_mode']:.1f}, "
                f"chains from mode {r['chains_from_mode']:.1f}, H eig [{eig}] "
                f"(floor {r.get('floor', float('nan')):.3f}), clip_H {r['clip_H']:.3g}, "
                f"bulk ESS {r['ess']:.0f}, {r['verdict']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
