"""How a penalty chain tunes itself from released outcomes only (post-processing, no cost).

- :mod:`.proposal`: the random-walk proposal's scale and shape.
- :mod:`.clip`: the clip constant, found from noisy clipped counts.
- :mod:`.pending`: a step's update, held back to the start of the next tuning step.
- :mod:`.state`: a step's adapters and their sampling state.
"""

from pymc_penalty.sampling.adaptation.clip import *  # noqa: F403
from pymc_penalty.sampling.adaptation.clip import __all__ as _clip_all
from pymc_penalty.sampling.adaptation.proposal import *  # noqa: F403
from pymc_penalty.sampling.adaptation.proposal import __all__ as _proposal_all

__all__ = [*_proposal_all, *_clip_all]
