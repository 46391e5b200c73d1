"""The `workbench` command line: metadata tables, device doctor, benchmarks, contract checks, demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from workbench.errors import WorkbenchError
from workbench.profiles import PROFILES


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _bucket(text: str) -> int | str | None:
    if text == "auto":
        return "auto"
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bucket must be 'auto', 'none' or an int, got {text!r}") from None


def metadata_for_cli(args: argparse.Namespace):
    """Build the metadata the `metadata` subcommand prints (a fresh pool, requests allocated in order)."""
    from workbench import Batch, StatePool, build_metadata, get_profile

    d = args.draft_tokens
    spr = get_profile(args.profile).slots_per_request(d if args.mode == "target_verify" else 1)
    lens = args.extend_lens if args.mode == "extend" else args.seq_lens
    n = 0 if args.mode == "idle" else len(lens or [])
    if args.mode != "idle" and not lens:
        flag = "--extend-lens" if args.mode == "extend" else "--seq-lens"
        raise WorkbenchError(f"{flag} is required for mode {args.mode!r}")
    pool = StatePool(num_slots=max(args.num_slots, n * spr + 1), profile=args.profile, slots_per_request=spr)
    rows = pool.alloc(n)
    if args.mode == "decode":
        batch = Batch.decode(rows, args.seq_lens)
    elif args.mode == "target_verify":
        batch = Batch.target_verify(rows, args.seq_lens, draft_tokens=d)
    elif args.mode == "extend":
        batch = Batch.extend(rows, args.extend_lens, args.prefix_lens)
    else:
        batch = Batch.idle()
    return build_metadata(batch, pool, bucket=args.bucket, buckets=args.buckets)


def _cmd_metadata(args: argparse.Namespace) -> int:
    meta = metadata_for_cli(args)
    print(json.dumps(meta.to_dict(), indent=2) if args.json else meta.table())
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from workbench.devices import doctor_text

    print(doctor_text(probe_npu=not args.no_npu_probe))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from workbench.bench.cli import run_bench

    return run_bench(args)


def _cmd_zoo(args: argparse.Namespace) -> int:
    from workbench.zoo.cli import run_cli

    return run_cli(args.names, list_only=args.list, as_json=args.json, backend=args.backend)


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.demo import run_demo

    return run_demo(out=args.out, quick=args.quick)


def _cmd_report(args: argparse.Namespace) -> int:
    from workbench.report import write_report

    path = write_report(args.out, device=args.device, quick=args.quick, progress=True)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("metadata", help="print the padded metadata of a batch as a table (or JSON)")
    m.add_argument("--profile", default="sglang", choices=list(PROFILES))
    m.add_argument("--mode", default="decode", choices=["decode", "target_verify", "extend", "idle"])
    m.add_argument("--seq-lens", type=_int_list, help="comma-separated, one per request (decode, verify)")
    m.add_argument("--extend-lens", type=_int_list, help="comma-separated new tokens per request (extend)")
    m.add_argument("--prefix-lens", type=_int_list, help="comma-separated cached tokens per request (extend)")
    m.add_argument("--draft-tokens", "-D", type=int, default=1, help="tokens per request in target_verify")
    m.add_argument("--bucket", type=_bucket, default="auto", help="'auto', 'none' or a captured batch size")
    m.add_argument("--buckets", type=_int_list, default=None, help="captured batch sizes (default: engine list)")
    m.add_argument("--num-slots", type=int, default=64)
    m.add_argument("--json", action="store_true", help="print JSON instead of a table")
    m.set_defaults(fn=_cmd_metadata)

    d = sub.add_parser("doctor", help="which devices and backends are usable here, and why not")
    d.add_argument("--no-npu-probe", action="store_true", help="skip the torch_npu subprocess probe")
    d.set_defaults(fn=_cmd_doctor)

    b = sub.add_parser("bench", help="benchmarks: print figures and write JSON (bench-results/<what>_<device>.json)")
    b.add_argument("what", choices=["metadata", "kernels", "replay", "widgets"])
    b.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    b.add_argument("--device", default="auto", help="auto (cuda, then npu, else cpu) | cpu | cuda | npu")
    b.add_argument(
        "--json", default=None, help="output path; its folder must exist (default bench-results/<what>_<device>.json)"
    )
    b.add_argument(
        "--threads", type=int, default=None, help="CPU threads to time with (default: torch's, here all cores)"
    )
    b.add_argument("--plot", default=None, metavar="FILE.html", help="also draw the figures into FILE.html")
    b.add_argument(
        "--from", dest="from_json", default=None, metavar="FILE.json", help="redraw --plot from saved JSON; run nothing"
    )
    b.set_defaults(fn=_cmd_bench)

    r = sub.add_parser("report", help="one self-contained HTML report (opens offline)")
    r.add_argument("--device", default="auto", help="auto (cuda, then npu, else cpu) | cpu | cuda | npu")
    r.add_argument("--out", default="report.html", help="output file; its folder must exist (default report.html)")
    r.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings (seconds)")
    r.set_defaults(fn=_cmd_report)

    from workbench.contracts.cli import add_parser as add_check_contracts  # stdlib-only: no torch import

    add_check_contracts(sub)

    z = sub.add_parser("zoo", help="run known production bugs unfixed and fixed, one line each")
    z.add_argument("names", nargs="*", metavar="NAME", help="cases to run (default: all)")
    z.add_argument("--list", action="store_true", help="list the cases without running them")
    z.add_argument("--json", action="store_true", help="print JSON instead of lines")
    z.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "npu"], help="auto: the CPU recorder")
    z.set_defaults(fn=_cmd_zoo)

    e = sub.add_parser("demo", help="headless tour: run the main job and write the report")
    e.add_argument("--out", default="report.html", help="report path; its folder must exist (default report.html)")
    e.add_argument("--quick", action="store_true", help="a quick report (seconds)")
    e.set_defaults(fn=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
