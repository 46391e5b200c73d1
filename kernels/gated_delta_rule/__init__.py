"""Gated delta rule (Gated DeltaNet) over a pool of recurrent states.

Public ops (see ops.py for the full contract; all tokens packed along T; the pool K-first by default,
`state_layout="v_first"` for [num_slots, HV, V, K] pools as the released engines keep them):
    recurrent(q, k, v, g, beta, *, state, state_indices, cu_seqlens, ...) -> out  decode / verify / extend
    recurrent(q, k, v, *, a=, b=, A_log=, dt_bias=, state=, ...) -> out            engine gating in-kernel
    recurrent(q, k, v, *, gk=, beta=, state=, ...) -> out                          KDA: gate per key channel
    chunked(q, k, v, g, beta, *, state, state_indices, cu_seqlens, chunk_size=...)  prefill (WY / UT)
    chunked(q, k, v, *, gk=, beta=, state=, ...)                                   KDA prefill
    recurrent(..., intermediate_states=, disable_state_update=True, retrieve_parent_token=)  tree verify
    scatter_accepted(state, intermediate_states, state_indices, num_accepted)     after target-verify
    scatter_accepted(state, intermediate_states, state_indices, accepted_steps=)  a tree's accepted node
Each is one `torch.ops.linattn.*` custom op. Cost models: recurrent_cost, chunked_cost, scatter_accepted_cost.
chunked's default chunk is `ops.DEFAULT_CHUNK_SIZE` (16 tokens: what the Triton kernel keeps in registers
without spilling much; see ops.py).
"""

from kernels.gated_delta_rule.cost import chunked_cost, recurrent_cost, scatter_accepted_cost
from kernels.gated_delta_rule.ops import chunked, recurrent, scatter_accepted
from kernels.gated_delta_rule.reference import chunk_step, gating, l2norm

__all__ = [
    "chunk_step",
    "chunked",
    "chunked_cost",
    "gating",
    "l2norm",
    "recurrent",
    "recurrent_cost",
    "scatter_accepted",
    "scatter_accepted_cost",
]
