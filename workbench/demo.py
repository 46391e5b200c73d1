"""`workbench demo` / `make demo`: a headless tour of the metadata engine for every profile and mode, then
the HTML report (``workbench.report``) written to ``--out``."""

from __future__ import annotations

from workbench.batch import Batch
from workbench.metadata import build_metadata, validate
from workbench.pool import StatePool
from workbench.profiles import PROFILES, get_profile


def metadata_tour() -> str:
    """Decode and verify metadata of the same 5 requests, padded to bucket 8, under every profile."""
    parts = []
    for name in PROFILES:
        for mode in ("decode", "target_verify"):
            spr = get_profile(name).slots_per_request(3 if mode == "target_verify" else 1)
            pool = StatePool(32, name, slots_per_request=spr)
            scratch = pool.alloc(6)
            pool.free(scratch[::2])  # leave holes, so the batch's slots are not simply 1..5
            rows = pool.alloc(5)
            seq = [7, 3, 9, 4, 12]
            batch = Batch.decode(rows, seq) if mode == "decode" else Batch.target_verify(rows, seq, draft_tokens=3)
            meta = build_metadata(batch, pool, bucket="auto", buckets=[1, 2, 4, 8, 16])
            validate(meta, pool)
            parts.append(meta.table())
    return "\n\n".join(parts)


def run_demo(out: str | None = "report.html", *, quick: bool = False, device: str = "auto") -> int:
    """Print the tour; write the report to ``out`` (its folder must exist; None: tour only) and say where.
    A bad ``out`` is refused before the tour runs."""
    from pathlib import Path

    from workbench.report import check_out_path, write_report

    if out is not None:
        check_out_path(out)
    print(metadata_tour())
    if out is None:
        return 0

    path = write_report(out, device=device, quick=quick, progress=True)
    print(f"\nreport: {Path(path).resolve()}")
    return 0
