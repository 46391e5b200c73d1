"""sglang 0.5.23's own ``KDAAttnBackend`` on the CPU (sglang PR 38994, open): its accepted-state lists are built
lazily in warm-up and the captured graph reads warm-up's arrays at every replay; clearing them in the in-graph
hook (the PR's fix) makes a replay read its own. Needs the released engine (``make engines``)."""

from __future__ import annotations

import pytest

from workbench.engines.registry import get_adapter
from workbench.engines.versions import installed_version
from workbench.zoo import kda_frozen_accept_lists as case
from workbench.zoo.result import RowsDiffer

ADAPTER = get_adapter("sglang")
pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        installed_version("sglang") != ADAPTER.version,
        reason=f"sglang {ADAPTER.version} is not installed (found {installed_version('sglang')}); make engines",
    ),
]


def test_replay_reads_warm_up_lists():
    nat, rows = case.engine_run(False)
    assert isinstance(nat, RowsDiffer) and isinstance(rows, RowsDiffer)
    # the replay's requests on slots 1, 2, 3 accepted 2, 1, 2; the graph reads warm-up's dummy-slot lists
    assert (nat.rows, nat.got, nat.expected) == ([0, 2], [1, 1], [2, 2])
    assert rows.rows == [0, 1, 2, 3] and rows.got == [[0, 1]] * 4
    assert rows.expected == [[2, 3], [4, 5], [6, 7], [-2, -1]]  # the padded row's lists are negative


def test_clearing_in_the_in_graph_hook_fixes_it():
    assert not any(e.broken for e in case.engine_run(True))


def test_zoo_case_runs_the_engine_where_installed():
    res = case.CASE.run(False)
    assert any("KDAAttnBackend" in e.what for e in res.evidence if isinstance(e, RowsDiffer))
    assert not case.CASE.run(True).broken


def test_engine_check_runs_sglangs_kda_backend_as_oracle_and_subject():
    """``engine-check sglang --layer kda``: the KDA layer captured and replayed through sglang's own
    ``KDAAttnBackend``, and its metadata equal to the profile's on random batches."""
    from workbench.engines.check import engine_check

    adapter = get_adapter("sglang")
    assert "kda" in adapter.layers
    result = engine_check(adapter, layer="kda", batches=30)
    assert result.ok and result.label.endswith("KDAAttnBackend (real code)"), str(result)
    assert result.oracle is not None and result.oracle.ok and result.replays > 0
