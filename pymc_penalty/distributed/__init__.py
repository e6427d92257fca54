"""Several data owners on a real distributed engine (Dask distributed).

Each owner's rows live on its own worker process and never reach the driver: the owner
loads them, compiles the model there, keeps the per-row cache, draws its own noise and
charges its own ledger before it reads a row. See :class:`OwnerPool`, and :func:`sample` for
the penalty chain (Algorithm 2) driven through it.

One curator's table split into shards on workers, with one noise draw per release at the
driver: :class:`ShardPool` and :func:`sample_sharded` (``pp.sample(shards=...)``).

Needs the ``distributed`` extra: ``pip install 'pymc-penalty[distributed]'``.
"""

from pymc_penalty.distributed.pool import Owner, OwnerPool
from pymc_penalty.distributed.sampler import owner_noise, sample
from pymc_penalty.distributed.sharded import sample_sharded
from pymc_penalty.distributed.shards import ShardPool
from pymc_penalty.errors import DistributedSamplingError, OwnerError, ShardError

__all__ = [
    "DistributedSamplingError",
    "Owner",
    "OwnerError",
    "OwnerPool",
    "ShardError",
    "ShardPool",
    "owner_noise",
    "sample",
    "sample_sharded",
]
