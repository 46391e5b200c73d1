"""Mamba2's SSM on a pool of states, mamba_ssm semantics: the decode step and the prefill scan.

- ``selective_state_update``: state ``[num_slots, nheads, headdim, dstate]`` float32, one token per row (a
  decode) or L of them (a verify, with the state after each in ``intermediate_states`` and the pool left
  alone under ``disable_state_update``; a draft tree's nodes with ``retrieve_parent_token``), ``ngroups``
  groups of B/C shared by ``nheads // ngroups`` heads each.
- ``chunk_scan``: a packed prefill batch (``cu_seqlens``), each row from its slot or zeros, optionally
  writing the chunk states on one grid over the flattened batch (``chunk_grid``: the grid sglang issue
  31833 misread).
- ``selective_state_update_cost``, ``chunk_scan_cost``: bytes and FLOPs.

Padding follows ``kernels/padding.py``: a skipped row reads and writes no slot and outputs zeros
(mamba_ssm-derived engine kernels leave such outputs computed from garbage; here they are zeros).
Rows sharing a processed slot (padded rows on the dummy slot under ``pad_slot_id=None``) race.

Implementations: ``reference.py`` (torch, float64-capable), ``triton_ssu.py`` and ``triton_scan.py`` (fp32
compute; the scan is token-sequential, not the SSD chunked algorithm). Each public function calls one custom
op, ``linattn::mamba2_selective_state_update`` or ``linattn::mamba2_chunk_scan``.

Untested without Ascend hardware: whether triton-ascend compiles ``triton_ssu.py`` (masked loads and
stores, ``tl.exp``/``tl.log``, ``tl.sum``; 3-D grid with heads on axis 2), and its tile choice (at most
4096 state elements per program). Only run here under ``TRITON_INTERPRET=1``, not on a GPU.
"""

from .cost import chunk_scan_cost, selective_state_update_cost
from .ops import chunk_scan, selective_state_update

__all__ = ["chunk_scan", "chunk_scan_cost", "selective_state_update", "selective_state_update_cost"]
