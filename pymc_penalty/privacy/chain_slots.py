"""The chains a budgeted step's plan pays for: one slot each, claimed as a chain starts releasing.

``pm.sample`` may run more chains than the step was planned for (``chains=4`` where the plan
has 2). Without slots the extra chains race the planned ones for the ledger's budget, and
with several processes every chain may end shorter than planned. With slots the first
``plan.chains`` chains to release claim one each and run their full length; any further
chain releases nothing, and :func:`pymc_penalty.finalize` removes it and says so.

A slot is a file created with ``O_CREAT | O_EXCL`` in a folder the step makes: atomic across
the forked, spawned or forkserver processes that run the chains, with no lock to hold. The
folder is removed when the step that made it is collected in the process that made it.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

__all__ = ["ChainSlots"]


def _remove(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # never from a forked worker's copy
        shutil.rmtree(path, ignore_errors=True)


class ChainSlots:
    """``chains`` slots shared by every process that runs a copy of one step.

    Parameters
    ----------
    chains : int
        The number of chains the plan pays for.
    """

    def __init__(self, chains: int) -> None:
        self.chains = int(chains)
        self.path = tempfile.mkdtemp(prefix="pymc_penalty_chains_")
        weakref.finalize(self, _remove, self.path, os.getpid())

    def claim(self) -> int | None:
        """Claim the lowest free slot; its index, or None when every slot is taken."""
        for index in range(self.chains):
            try:
                fd = os.open(os.path.join(self.path, str(index)), os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                continue
            os.close(fd)
            return index
        return None

    def __getstate__(self) -> dict[str, object]:
        return {"chains": self.chains, "path": self.path}

    def __setstate__(self, state: dict[str, object]) -> None:
        # An unpickled copy (a worker process) shares the folder and never removes it.
        self.chains = int(state["chains"])  # type: ignore[arg-type]
        self.path = str(state["path"])
