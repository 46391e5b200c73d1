"""Batches per second through each engine adapter: the engine's own metadata code against the profile.

    .venv-engines/bin/python benchmarks/engine_adapters.py [--batches N] [--json PATH]

Needs the engines installed beside the CPU torch (``make engines``; not part of ``make test``). For each
installed engine and layer, :func:`workbench.engines.oracle.compare` runs ``--batches`` random batches per
mode (decode, target_verify, extend, idle; eager path, and the replay path for the captured modes) through
the engine and through the workbench's profile, bitwise; it prints batches/s, the seconds per 1,000 batches
per mode (the goal: under 30 s on the 2-core development machine) and any divergence, and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.engines import EngineError, adapter_class, installed_engines  # noqa: E402
from workbench.engines.base import probe_pool  # noqa: E402
from workbench.engines.oracle import compare  # noqa: E402
from workbench.pool import StatePool  # noqa: E402

BUCKETS = (1, 2, 4, 8, 16)
DRAFT_TOKENS = 2


def variants(engine: str) -> list[tuple[str, type | None]]:
    """(layer, backend class) pairs to compare: the engine's default classes, and sglang's Ascend ones (the
    sglang-ascend profile's engine code)."""
    out: list[tuple[str, type | None]] = [(layer, None) for layer in adapter_class(engine).layers]
    if engine == "sglang":
        from workbench.engines.sglang_0_5_23 import load_ascend

        mamba2, gdn = load_ascend()
        out += [("gdn", gdn), ("mamba2", mamba2)]
    return out


def run(engine: str, layer: str, backend_class: type | None, batches: int) -> dict[str, Any]:
    """One engine class: the oracle over every mode, timed."""
    cls = adapter_class(engine)
    probe = cls(probe_pool(cls, DRAFT_TOKENS), BUCKETS, DRAFT_TOKENS, layer=layer, backend_class=backend_class)
    pool = StatePool(128, probe.profile, slots_per_request=DRAFT_TOKENS if probe.profile == "vllm" else 1)
    pool.alloc(min(pool.capacity, 48))
    adapter = cls(pool, BUCKETS, DRAFT_TOKENS, layer=layer, backend_class=backend_class)
    result = compare(adapter, batches=batches, seed=0)
    total = sum(result.batches.values())
    return {
        "engine": result.engine,
        "layer": layer,
        "profile": result.profile,
        "batches": result.batches,
        "seconds": round(result.seconds, 3),
        "batches_per_s": round(total / result.seconds, 1) if result.seconds else None,
        "seconds_per_1000_per_mode": round(result.seconds / len(result.batches) * 1000 / batches, 2),
        "ok": result.ok,
        "divergences": [str(d) for d in result.divergences],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000, help="random batches per mode and path")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "engine_adapters.json")
    args = parser.parse_args()
    engines = installed_engines()
    if not engines:
        print("no engine installed at a supported version: make engines (then run with .venv-engines/bin/python)")
        raise SystemExit(2)
    rows = []
    for engine in engines:
        for layer, backend_class in variants(engine):
            try:
                row = run(engine, layer, backend_class, args.batches)
            except EngineError as e:
                print(f"{engine} {layer}: {e}")
                continue
            rows.append(row)
            status = "equal bitwise" if row["ok"] else f"{len(row['divergences'])} mode(s) differ"
            print(
                f"{row['engine']:<55} {row['batches_per_s']:>9} batches/s  "
                f"{row['seconds_per_1000_per_mode']:>6} s per 1,000 per mode  {status}"
            )
            for text in row["divergences"]:
                print(f"    {text}")
    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    data = {"date": datetime.date.today().isoformat(), "environment": env, "batches": args.batches, "rows": rows}
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
