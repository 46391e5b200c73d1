"""Plain (ungated) linear attention: the simplest recurrent layer, on the same pool layout as GDN.

Start here. A request's memory is a state ``S`` (``[K, V]`` per value head, float32) in a pool slot
``state[num_slots, HV, K, V]`` (``state_layout="v_first"``: ``[num_slots, HV, V, K]``). Each token adds
``k v^T`` to S and reads ``o = S^T (scale q)``. Gated DeltaNet (``kernels/gated_delta_rule``) adds a decay
of S and a delta-rule correction to the same loop.

- ``recurrent``: packed tokens over ``cu_seqlens`` (decode, verify-like fixed lengths or prefill).
- ``recurrent_cost``: bytes and FLOPs.

Padding follows ``kernels/padding.py``: a skipped row reads and writes no slot and outputs zeros; tokens
after ``cu_seqlens[N]`` output zeros. Rows sharing a processed slot race.

Implementations: ``reference.py`` (torch, one token at a time, float64-capable) and
``triton_recurrent.py`` (fp32). The public function calls one custom op,
``linattn::linear_attn_recurrent``.

Untested without Ascend hardware: whether triton-ascend compiles ``triton_recurrent.py`` (masked
loads/stores, ``tl.sum``, runtime ``for`` bounds loaded from memory) and its register budget for the
``[next_pow2(K), BLOCK_V]`` state tile. Only run here under ``TRITON_INTERPRET=1``, not on a GPU.
"""

from .cost import recurrent_cost
from .ops import recurrent

__all__ = ["recurrent", "recurrent_cost"]
