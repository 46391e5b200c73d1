"""Mamba2's single-step selective state update (decode) on a pool of SSM states, mamba_ssm semantics.

- ``selective_state_update``: state ``[num_slots, nheads, headdim, dstate]`` float32, one token per row,
  ``ngroups`` groups of B/C shared by ``nheads // ngroups`` heads each.
- ``selective_state_update_cost``: bytes and FLOPs.

Padding follows ``kernels/padding.py``: a skipped row reads and writes no slot and outputs zeros
(mamba_ssm-derived engine kernels leave such outputs computed from garbage; here they are zeros).
Rows sharing a processed slot (padded rows on the dummy slot under ``pad_slot_id=None``) race.

Implementations: ``reference.py`` (torch, float64-capable) and ``triton_ssu.py`` (fp32 compute).
The public function calls one custom op, ``linattn::mamba2_selective_state_update``.

Untested without Ascend hardware: whether triton-ascend compiles ``triton_ssu.py`` (masked loads and
stores, ``tl.exp``/``tl.log``, ``tl.sum``; 3-D grid with heads on axis 2), and its tile choice (at most
4096 state elements per program). Only run here under ``TRITON_INTERPRET=1``, not on a GPU.
"""

from .cost import selective_state_update_cost
from .ops import selective_state_update

__all__ = ["selective_state_update", "selective_state_update_cost"]
