"""What each notebook must print when what it demonstrates holds, and how long it may take: the claims both
notebook runners check (``tests/test_notebooks.py`` in a kernel of its own, ``tests/test_browser.py`` in
JupyterLab).

A notebook whose browser test passed in this session is not run a second time by ``test_notebooks.py``: the
browser test checked the same claims, on the same fresh kernel's outputs (:data:`CHECKED_IN_BROWSER`). A
notebook the browser did not run (Chromium missing, the module deselected, run after) or whose browser test
failed is run by ``test_notebooks.py`` as before, so a failure in the lab gets a second, browser-free opinion.

A plain module beside the tests (``tests`` is not a package), imported as ``_notebook_claims``.
"""

from __future__ import annotations

import pytest

EXPECTED: dict[str, list[str]] = {
    "00_quickstart.ipynb": [
        "graph update equals eager build: True",
        "same buffer address as at capture: True",
    ],
    "01_capture_and_replay.ipynb": [
        "slots written by capture: [0]",
        "integrity: clean",
        "in forward: `n = int(meta.query_start_loc[-1])  # host read`.",  # the CaptureError whole, to its end
    ],
    "02_padding_conventions.ipynb": [
        "sglang-ascend wrote slot 0: True | sglang: False | vllm: False",
        "gated delta rule on sglang-ascend wrote slot 0: False",
    ],
    "04_kernel_prototyping.ipynb": [
        "linear_attn.recurrent[extend] [my_linear_attn]: PROBLEMS",
        "capture: FAILED: capture refused",
        "linear_attn.recurrent[decode] [notebook::my_linear_attn]: OK",
        "linear_attn.recurrent[extend] [notebook::my_linear_attn]: OK",
        "causal_conv1d.update[decode] [forgets_the_guard]: PROBLEMS",
        "guard band before conv_state",
        "FAIL linear_attn.recurrent[extend] vllm (padded rows with tokens): ",
        'causal_conv1d.update[decode] [causal_conv1d.update (impl="triton")]: OK',
        'mamba2.selective_state_update[decode] [mamba2.selective_state_update (impl="triton")]: OK',
        "every built-in Triton kernel passes: True",
    ],
    "05_timings.ipynb": ["records: 8", "loaded 14 records of gdn quarter"],
    "06_serving_traces.ipynb": ["OK: sglang gdn: 60 steps"],
    "07_prefix_caching.ipynb": [
        "after the same 6 tokens twice: identical True",
        "prefix cache: 1 hit(s), 2 checkpoint(s) published, 2 verified against the float64 state",
        "OK: sglang gdn: 100 steps",
        "OK: vllm gdn: 100 steps",
        "verified against the float64 state of exactly their prefix, every request on its float64 recurrence",
        "every unfixed prefix case broke: True",
        "every fixed prefix case clean: True",
        "off the float64 state after exactly its first 8 tokens",
        "entry of h -> (row, its tokens): {0: (0, 0), 1: (0, 16), 2: (1, 12), 3: (2, 8)}",
        "OK: sglang mamba2: 150 steps",
        "track_ssm_h_src[1] = 3, but h[3] is row 2's state after 8 tokens",
    ],
    "08_tree_drafts.ipynb": [
        "derived as sglang's conv kernel does: [[0, 0, 0, 1]]",
        "node 2 in the tree == chain (root, node 2): True",
        "node 1 (its parent is the node before it): tree == chain: True",
        "unfixed: verify outputs of each node",
        "fixed clean: True",
        "commit node 2 == chain (root, node 2): True",
        "tree_commit_depth (sglang PR 27463): unfixed broke True, fixed clean True",
        "tree_track_unclamped (sglang PR 35821): unfixed broke True, fixed clean True",
        "ghost_node_cow (sglang PR 35821): unfixed broke True, fixed clean True",
        "OK: sglang gdn: 60 steps",
    ],
    "03_bug_zoo.ipynb": [
        "every unfixed run broke: True",
        "every fixed run clean: True",
        "step 3: state: ssm, request 1, row 0, slot 1: state off reference",
        "slot 1 last held request 0, whose final state request 1 started from",
        "reproduced: ['in_capture']",
        "fixed backend clean: True",
    ],
}
"""Lines a notebook prints (its stdout and stderr streams) when what it demonstrates really holds."""

# wall-clock limit of a whole notebook's run (seconds) on the 2-core CPU machine; the default for others
TIME_LIMIT = {"04_kernel_prototyping.ipynb": 240, "05_timings.ipynb": 240, "03_bug_zoo.ipynb": 240}
DEFAULT_LIMIT = 150

CHECKED_IN_BROWSER = pytest.StashKey[set[str]]()
"""``config.stash`` key: the notebooks whose browser test passed in this session (every claim here checked)."""


def time_limit(name: str) -> int:
    """Seconds notebook ``name`` may take to run top to bottom."""
    return TIME_LIMIT.get(name, DEFAULT_LIMIT)


def missing_lines(name: str, printed: str) -> list[str]:
    """The lines notebook ``name`` must print that ``printed`` (its streams' text) lacks."""
    return [line for line in EXPECTED.get(name, []) if line not in printed]


def checked_in_browser(config: pytest.Config) -> set[str]:
    """The session's set of notebooks checked whole by the browser test (created empty on first use)."""
    return config.stash.setdefault(CHECKED_IN_BROWSER, set())
