"""Short causal convolution (the conv1d in front of Mamba2 / Gated DeltaNet), on a pool of conv states.

Layout: activations channels last (``x`` is ``[N, L, dim]`` for decode/verify, ``[T, dim]`` packed for
prefill); ``conv_state`` is a pool ``[num_slots, dim, W-1]`` holding each request's W-1 previous
inputs, oldest first; ``weight`` is ``[dim, W]`` with the last column on the newest input.

- ``update``: decode (L = 1) and target-verify (L = D, optional per-step windows by batch row), along a
  chain or a draft tree (``retrieve_parent_token``: a node convolves its ancestors' inputs).
- ``varlen``: prefill over ``cu_seqlens``, optional initial state per sequence.
- ``update_cost`` / ``varlen_cost``: bytes and FLOPs.

Padding follows ``kernels/padding.py``: a skipped row reads and writes no slot and outputs zeros.
Rows that share a processed slot (several padded rows on the dummy slot under ``pad_slot_id=None``)
race: which write lands is unspecified, as in the engines.

Implementations: ``reference.py`` (torch, float64-capable) and ``triton_conv.py`` (one Triton kernel for
both entry points, fp32 compute). Each public function calls one ``linattn::`` custom op
(``linattn::causal_conv1d_update``, ``linattn::causal_conv1d_varlen``).

Untested without Ascend hardware: whether triton-ascend compiles and runs ``triton_conv.py`` (it uses
only masked loads/stores, ``tl.exp``, ``tl.static_range`` and a runtime ``for`` over tokens), its grid
choice (one program per row and channel block; Ascend prefers fewer, longer programs), and the
behaviour of the bool ``has_initial_state`` pointer there. Not tested on a GPU in this repository's
CPU suite either: only under ``TRITON_INTERPRET=1``.
"""

from .cost import update_cost, varlen_cost
from .ops import ACTIVATIONS, update, varlen

__all__ = ["ACTIVATIONS", "update", "update_cost", "varlen", "varlen_cost"]
