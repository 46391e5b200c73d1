"""The `workbench` command line: metadata tables, device doctor, benchmarks, contract checks, demo.

The top dispatcher: the only entry point that imports the others (``bench``, ``demo``, ``report``,
``contracts``, the widgets' benchmark), each lazily inside its command.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from workbench.errors import MetadataError, WorkbenchError
from workbench.limits import INT32_MAX, check_memory, gib
from workbench.profiles import PROFILES, default_bucket_bytes, get_profile
from workbench.threads import ENV as THREADS_ENV  # torch-free until configure() runs

# what `workbench --help` says above the list of commands: for the user, not about this module
DESCRIPTION = (
    "linattn-workbench: check and measure the linear-attention layers of LLM serving engines (sglang, sglang "
    "on Ascend, vLLM) on this machine. It builds the padded metadata of a batch as each engine does, captures "
    "and replays a layer step as a CUDA graph would (on the CPU too), checks Triton kernels against a float64 "
    "reference under every padding convention, reproduces bugs that shipped in the engines, and times kernels "
    "and replayed steps.\n"
    "\n"
    "Start with `workbench demo` (a headless tour, then an HTML report) or `workbench doctor` (which devices "
    "work here). Each command below has its own --help with an example; `make lab` opens the notebooks and "
    "their widgets."
)

# torch is imported only inside the commands (after parsing), so `--help` and argument errors are instant.
MODES = ("decode", "target_verify", "extend", "idle")  # workbench.batch.MODES, without importing torch
# More timing threads than cores only makes them spin against each other (and torch refuses huge counts).
MAX_THREADS = os.cpu_count() or 1
# The commands that compute (replays, kernels, timings) run torch at workbench.threads' count: one thread unless
# `bench --threads N` or LINATTN_THREADS says otherwise. The others build one small table, probe the devices
# (doctor reports torch's own count) or read source (check-contracts imports no torch): nothing to set.
COMPUTE_COMMANDS = frozenset({"bench", "trace", "check-kernel", "zoo", "engine-check", "report", "demo"})
NO_COMPUTE_COMMANDS = frozenset({"metadata", "doctor", "check-contracts"})


class _Parser(argparse.ArgumentParser):
    """An argument error is one line (``workbench metadata: error: argument --x: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        # an argument may hold a line break or a control character (U+0085...): escape it, keep one line
        clean = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in message)
        self.exit(2, f"{self.prog}: error: {clean} (see '{self.prog} --help')\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help shows every default and keeps the line breaks of the description and the example epilog
    (each line still wrapped). Options without a value default (None: the help text says what happens;
    a switch: off) and help texts that already state theirs show no extra ``(default: ...)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(
            textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent) if line else ""
            for line in text.splitlines()
        )


def _subcommand(sub: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    """A subparser with the house help style: defaults shown, one example in the epilog."""
    return sub.add_parser(
        name, help=summary, description=summary, epilog=f"example:\n  {example}", formatter_class=_Formatter
    )


def _int_in(lo: int, hi: int = INT32_MAX) -> Callable[[str], int]:
    """argparse type: one int in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is out of range: expected an int in [{lo}, {hi}]")
        return value

    return parse


def _int_list(lo: int, hi: int = INT32_MAX) -> Callable[[str], list[int]]:
    """argparse type: comma-separated ints, each in ``[lo, hi]`` (hi: int32, as the metadata tensors)."""

    def parse(text: str) -> list[int]:
        items = text.split(",")
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}")
        out = []
        for i, item in enumerate(items):
            try:
                value = int(item)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"item {i} of {text!r} is {item!r}: expected comma-separated ints"
                ) from None
            if not lo <= value <= hi:
                raise argparse.ArgumentTypeError(f"{value} (item {i}) is out of range: expected ints in [{lo}, {hi}]")
            out.append(value)
        return out

    return parse


def _bucket(text: str) -> int | str | None:
    if text == "auto":
        return "auto"
    if text == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'none' or an int, got {text!r}") from None
    if not 1 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(
            f"{value} is out of range: expected 'auto', 'none' or an int in [1, {INT32_MAX}]"
        )
    return value


def _num_slots(text: str) -> int:
    """argparse type of --num-slots: an int >= 2 whose slot mapping fits this machine's free memory."""
    value = _int_in(2, 2**63 - 1)(text)
    # What `metadata` really allocates for it: StatePool's int32 slot mapping and the default bucket list
    # (Python ints, up to the pool's capacity), with a quarter on top for the interpreter and torch.
    mapping, buckets = 4 * value, default_bucket_bytes(value)
    what = f"a slot mapping of {value:,} rows of 4 B and the default bucket list ({gib(buckets)}), with 25% headroom"
    try:
        check_memory(str(value), (mapping + buckets) * 5 // 4, what)
    except MetadataError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


# -- metadata ---------------------------------------------------------------------------------------------
# Which of the per-request flags each mode reads; the others are an error, not ignored.
_MODE_FLAGS = {
    "decode": {"--seq-lens": True},
    "target_verify": {"--seq-lens": True, "--draft-tokens": True},
    "extend": {"--extend-lens": True, "--prefix-lens": False},
    "idle": {},
}
_FLAG_DEST = {
    "--seq-lens": "seq_lens",
    "--extend-lens": "extend_lens",
    "--prefix-lens": "prefix_lens",
    "--draft-tokens": "draft_tokens",
}


def check_metadata_args(args: argparse.Namespace) -> None:
    """Cross-flag rules of `metadata` (argparse checks each flag alone); raise MetadataError naming the flag."""
    allowed = _MODE_FLAGS[args.mode]
    for flag, dest in _FLAG_DEST.items():
        given = getattr(args, dest) is not None
        if given and flag not in allowed:
            reads = ", ".join(allowed) or "no per-request flag"
            raise MetadataError(f"{flag} does not apply to --mode {args.mode} (it reads {reads})", field=flag)
        if not given and allowed.get(flag):
            raise MetadataError(f"{flag} is required for --mode {args.mode}", field=flag)
    if args.bucket is None and args.buckets is not None:
        raise MetadataError(
            "--buckets does not apply with --bucket none (no padding, no captured sizes)", field="--buckets"
        )
    if args.buckets is not None:
        for i in range(1, len(args.buckets)):
            if args.buckets[i] <= args.buckets[i - 1]:
                raise MetadataError(
                    f"--buckets must be strictly increasing: {args.buckets[i]} (item {i}) after {args.buckets[i - 1]}",
                    field="--buckets",
                    row=i,
                )
    if args.mode == "extend" and args.prefix_lens is not None and len(args.prefix_lens) != len(args.extend_lens):
        raise MetadataError(
            f"--prefix-lens has {len(args.prefix_lens)} values for {len(args.extend_lens)} requests in --extend-lens",
            field="--prefix-lens",
        )
    lens = args.extend_lens if args.mode == "extend" else args.seq_lens
    n = len(lens or [])
    _check_token_totals(args, n)
    spr = get_profile(args.profile).slots_per_request(args.draft_tokens if args.mode == "target_verify" else 1)
    need = n * spr + 1  # + the reserved dummy slot
    if need > args.num_slots:
        per = f" of {spr} slots each (the profile keeps one per draft token)" if spr > 1 else ""
        raise MetadataError(
            f"--num-slots {args.num_slots} is too small for {n} request(s){per}: they need {need:,} slots "
            f"with the reserved dummy slot; pass --num-slots {need} or more",
            field="--num-slots",
        )
    _check_bucket(args, n, spr)


def _check_token_totals(args: argparse.Namespace, n: int) -> None:
    """The step's tokens are summed into int32 ``query_start_loc``, sequence lengths are int32."""
    if args.mode == "extend":
        total = sum(args.extend_lens)
        if total > INT32_MAX:
            raise MetadataError(
                f"--extend-lens sums to {total:,} tokens in one step; the total must fit int32 ({INT32_MAX:,})",
                field="--extend-lens",
            )
        for i, (pre, ext) in enumerate(zip(args.prefix_lens or [0] * n, args.extend_lens, strict=True)):
            if pre + ext > INT32_MAX:
                raise MetadataError(
                    f"--prefix-lens + --extend-lens = {pre + ext:,} (item {i}): "
                    f"a sequence length must fit int32 ({INT32_MAX:,})",
                    field="--extend-lens",
                    row=i,
                )
    if args.mode == "target_verify" and n * args.draft_tokens > INT32_MAX:
        raise MetadataError(
            f"--draft-tokens {args.draft_tokens} x {n} request(s) = {n * args.draft_tokens:,} tokens in one step; "
            f"the total must fit int32 ({INT32_MAX:,})",
            field="--draft-tokens",
        )


def _check_bucket(args: argparse.Namespace, n: int, spr: int) -> None:
    """--bucket against the captured list (--buckets, or the profile's list for the pool), and its memory."""
    if args.bucket is None or (args.bucket == "auto" and args.buckets is None):
        return  # the default list holds the batch within the pool's capacity, which --num-slots checked
    if args.buckets is not None:
        buckets, source = args.buckets, "--buckets"
    else:
        from workbench.buckets import capture_buckets  # no torch: profiles and errors only

        capacity = (args.num_slots - 1) // spr
        buckets = capture_buckets(capacity, args.mode == "target_verify", args.profile)
        source = f"the {args.profile} list for --num-slots {args.num_slots}"
    if isinstance(args.bucket, int):
        bs, flag = args.bucket, "--bucket"
        if bs not in buckets:
            shown = buckets if len(buckets) <= 40 else [*buckets[:20], "...", *buckets[-5:]]
            raise MetadataError(f"--bucket {bs} is not a captured size; captured ({source}): {shown}", field="--bucket")
        if n > bs:
            raise MetadataError(
                f"--bucket {bs} is smaller than the batch of {n} requests; a batch is never truncated", field="--bucket"
            )
    else:
        bs, flag = next((b for b in buckets if b >= n), n), "--buckets"
    # The padded metadata is allocated at the bucket's size, as build_metadata does.
    check_memory(f"{flag} {bs}", bs * (4 * spr + 25), f"metadata of {bs:,} padded rows")


def metadata_for_cli(args: argparse.Namespace) -> Any:
    """Build the metadata the `metadata` subcommand prints (a fresh pool, requests allocated in order)."""
    check_metadata_args(args)
    from workbench import Batch, StatePool, build_metadata

    d = args.draft_tokens
    spr = get_profile(args.profile).slots_per_request(d if args.mode == "target_verify" else 1)
    lens = args.extend_lens if args.mode == "extend" else args.seq_lens
    n = 0 if args.mode == "idle" else len(lens)
    pool = StatePool(num_slots=args.num_slots, profile=args.profile, slots_per_request=spr)
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


def add_metadata_parser(sub: Any) -> None:
    m = _subcommand(
        sub,
        "metadata",
        "print the padded metadata of a batch as a table (or JSON)",
        "workbench metadata --profile vllm --mode target_verify --seq-lens 7,3,9 -D 2",
    )
    m.add_argument("--profile", default="sglang", choices=list(PROFILES), help="engine conventions for padded rows")
    m.add_argument("--mode", default="decode", choices=MODES, help="forward mode of the step")
    m.add_argument(
        "--seq-lens",
        metavar="N,N,..",
        type=_int_list(1),
        help="comma-separated tokens per request after this step (decode, target_verify; required there)",
    )
    m.add_argument(
        "--extend-lens",
        metavar="N,N,..",
        type=_int_list(1),
        help="comma-separated new tokens per request (extend; required)",
    )
    m.add_argument(
        "--prefix-lens",
        metavar="N,N,..",
        type=_int_list(0),
        help="comma-separated cached tokens per request (extend; default 0 each)",
    )
    m.add_argument(
        "--draft-tokens", "-D", type=_int_in(1), metavar="D", help="tokens per request, D (target_verify; required)"
    )
    m.add_argument(
        "--bucket",
        type=_bucket,
        default="auto",
        metavar="auto|none|N",
        help="'auto', 'none' (no padding) or a captured batch size",
    )
    m.add_argument(
        "--buckets",
        type=_int_list(1),
        metavar="N,N,..",
        help="comma-separated captured batch sizes, increasing (default: the profile's engine list for the pool)",
    )
    m.add_argument(
        "--num-slots",
        type=_num_slots,
        default=64,
        metavar="N",
        help="state slots in the pool, the reserved dummy slot included",
    )
    m.add_argument("--json", action="store_true", help="print JSON instead of a table")
    m.set_defaults(fn=_cmd_metadata)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from workbench import threads
    from workbench.devices import doctor_text

    print(doctor_text(probe_npu=not args.no_npu_probe))
    print(threads.status())
    return 0


# `workbench bench <what>` -> the module whose run(quick, json_path, device) is the benchmark
BENCHMARKS = {
    "metadata": "workbench.bench.metadata",
    "kernels": "workbench.bench.kernels",
    "replay": "workbench.bench.replay",
    "trace": "workbench.bench.trace",
    "widgets": "workbench.widgets.bench",
}


def _benchmark(what: str) -> Callable[..., Any]:
    """The ``run`` function of benchmark ``what`` (imported now: it may pull in torch or ipywidgets)."""
    import importlib

    return importlib.import_module(BENCHMARKS[what]).run


def _cmd_bench(args: argparse.Namespace) -> int:
    from workbench.bench.cli import run_bench

    return run_bench(args, _benchmark(args.what))


def _cmd_zoo(args: argparse.Namespace) -> int:
    from workbench.zoo.cli import run_cli

    return run_cli(
        args.names,
        list_only=args.list,
        as_json=args.json,
        backend=args.backend,
        metadata_backend=args.metadata_backend,
        kernel=args.kernel,
        profile=args.profile,
        export=args.export,
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workbench.demo import run_demo
    from workbench.report import check_out_path, write_report

    replaced = check_out_path(args.out).exists()  # a bad --out is refused before the tour runs
    run_demo()
    path = write_report(args.out, quick=args.quick, progress=True)
    print(f"\nreport: {Path(path).resolve()}{_replaced_note(replaced)}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from workbench.report import check_out_path, write_report

    replaced = check_out_path(args.out).exists()
    path = write_report(args.out, device=args.device, quick=args.quick, progress=True)
    print(f"wrote {path}{_replaced_note(replaced)}")
    return 0


def _replaced_note(replaced: bool) -> str:
    """`workbench report` and `workbench demo` write report.html by default: say when one replaced a file."""
    return " (replaced the file that was there: --out names another)" if replaced else ""


def add_doctor_parser(sub: Any) -> None:
    d = _subcommand(
        sub, "doctor", "which devices and backends are usable here, and why not", "workbench doctor --no-npu-probe"
    )
    d.add_argument("--no-npu-probe", action="store_true", help="skip the torch_npu subprocess probe")
    d.set_defaults(fn=_cmd_doctor)


def add_bench_parser(sub: Any) -> None:
    b = _subcommand(
        sub,
        "bench",
        "benchmarks: print figures and write JSON (bench-results/<what>_<device>.json)",
        "workbench bench metadata --quick --device cpu",
    )
    b.add_argument("what", choices=list(BENCHMARKS), help="which benchmark")
    b.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    b.add_argument("--device", default="auto", help="auto (cuda, then npu, else cpu) | cpu | cuda | npu")
    b.add_argument(
        "--json", default=None, help="output path; its folder must exist (default bench-results/<what>_<device>.json)"
    )
    b.add_argument(
        "--threads",
        type=_int_in(1, MAX_THREADS),
        default=None,
        metavar="N",
        help=f"torch threads to run and time with, 1 to this machine's {MAX_THREADS} cores (default: "
        f"{THREADS_ENV} when set, else 1)",
    )
    b.add_argument("--plot", default=None, metavar="FILE.html", help="also draw the figures into FILE.html")
    b.add_argument(
        "--from", dest="from_json", default=None, metavar="FILE.json", help="redraw --plot from saved JSON; run nothing"
    )
    b.set_defaults(fn=_cmd_bench)


def add_report_parser(sub: Any) -> None:
    r = _subcommand(
        sub, "report", "one self-contained HTML report (opens offline)", "workbench report --quick --out report.html"
    )
    r.add_argument("--device", default="auto", help="auto (cuda, then npu, else cpu) | cpu | cuda | npu")
    r.add_argument("--out", default="report.html", help="output file; its folder must exist (default report.html)")
    r.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings (seconds)")
    r.set_defaults(fn=_cmd_report)


def add_check_contracts_parser(sub: Any) -> None:
    from workbench.contracts.cli import add_parser as add_check_contracts  # stdlib-only: no torch import

    parser = add_check_contracts(sub)
    parser.formatter_class = _Formatter  # defaults shown, like every subcommand
    parser.epilog = parser.epilog or "example:\n  workbench check-contracts workbench.backends"


def add_zoo_parser(sub: Any) -> None:
    z = _subcommand(
        sub,
        "zoo",
        "run known production bugs unfixed and fixed, or against your own backend, one line each",
        "workbench zoo --metadata-backend my_backend.py:AscendBackend",
    )
    z.add_argument(
        "names", nargs="*", metavar="NAME", help="cases to run (default: all; with your code, those that exercise it)"
    )
    z.add_argument("--list", action="store_true", help="list the cases without running them")
    z.add_argument("--json", action="store_true", help="print JSON instead of lines")
    z.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "npu"], help="auto: the CPU recorder")
    z.add_argument(
        "--metadata-backend",
        default=None,
        metavar="MODULE_OR_FILE:CLASS",
        help="run the cases that exercise a metadata backend against your MetadataBackend subclass instead",
    )
    z.add_argument(
        "--kernel",
        default=None,
        metavar="MODULE_OR_FILE:FUNCTION",
        help="run the cases that exercise a kernel (uninit_pad: a causal_conv1d.update) against your function",
    )
    z.add_argument(
        "--profile",
        default=None,
        choices=sorted(PROFILES),
        help="conventions for your code (default: sglang-ascend for an NPU-family backend, else sglang)",
    )
    z.add_argument("--export", default=None, metavar="DIR", help="write test_<case>.py of each failing case into DIR")
    z.set_defaults(fn=_cmd_zoo)


def add_check_kernel_parser(sub: Any) -> None:
    from workbench.kernelcheck.cli import EXAMPLE, SUMMARY, configure, run  # no torch until it runs

    configure(_subcommand(sub, "check-kernel", SUMMARY, EXAMPLE)).set_defaults(fn=run)


def add_engine_check_parser(sub: Any) -> None:
    from workbench.engines.cli import EXAMPLE, SUMMARY, configure, run  # no torch, no engine until it runs

    configure(_subcommand(sub, "engine-check", SUMMARY, EXAMPLE)).set_defaults(fn=run)


def add_trace_parser(sub: Any) -> None:
    from workbench.traces.cli import EXAMPLE, SUMMARY, configure, run  # no torch until it runs

    configure(_subcommand(sub, "trace", SUMMARY, EXAMPLE)).set_defaults(fn=run)


def add_demo_parser(sub: Any) -> None:
    e = _subcommand(sub, "demo", "headless tour: run the main job and write the report", "workbench demo --quick")
    e.add_argument("--out", default="report.html", help="report path; its folder must exist (default report.html)")
    e.add_argument("--quick", action="store_true", help="a quick report (seconds)")
    e.set_defaults(fn=_cmd_demo)


# One small function per subcommand; a new subcommand adds its own beside these.
SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_metadata_parser,
    add_doctor_parser,
    add_bench_parser,
    add_report_parser,
    add_check_contracts_parser,
    add_zoo_parser,
    add_demo_parser,
    add_check_kernel_parser,
    add_engine_check_parser,
    add_trace_parser,
]


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="workbench", description=DESCRIPTION, formatter_class=_Formatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND", title="commands")
    for add in SUBCOMMANDS:
        add(sub)
    p.set_defaults(_subparsers=sub.choices)
    return p


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is refused by the subcommand it was given to (its prefix and its
    --help), not by the top-level parser, which collects the leftovers."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        owner = args._subparsers.get(args.command, parser)
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


@contextmanager
def torch_threads(args: argparse.Namespace) -> Iterator[None]:
    """Run a command of :data:`COMPUTE_COMMANDS` at :func:`workbench.threads.configure`'s count (its
    ``--threads`` where it has one, else LINATTN_THREADS, else one), and give the caller's count back after:
    :func:`main` also runs in process (tests, notebooks). A bad LINATTN_THREADS is a WorkbenchError naming it."""
    if args.command not in COMPUTE_COMMANDS:
        yield
        return
    from workbench import threads

    given = getattr(args, "threads", None)  # bench --threads; argparse checked it
    try:
        threads.requested(given)  # a bad LINATTN_THREADS is refused before torch's import
    except ValueError as e:
        raise WorkbenchError(str(e)) from None
    import torch

    before = torch.get_num_threads()
    threads.configure(given)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``). Returns the exit status; an argument
    error exits 2 through ``SystemExit`` (argparse), a WorkbenchError is one ``error:`` line and status 2, and
    user code that tries to exit while a command runs (``sys.exit``, ``os._exit``) is one ``FAIL:`` line and
    status 1 (:func:`workbench.loading.exits_refused`)."""
    args = _parse(argv)
    from workbench.loading import UserCodeExit, exits_refused

    try:
        # a user's kernel or backend cannot end us with exit 0
        with torch_threads(args), exits_refused(f"workbench {args.command}"):
            return args.fn(args)
    except UserCodeExit as e:  # the check has no verdict: a failure, never "every check passed"
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    except WorkbenchError as e:
        print(f"workbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`workbench ... | head`): not an error of ours. Point stdout at devnull so the
        # interpreter's final flush cannot raise again, and exit as a closed pipe does for any Unix tool.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass  # stdout is no file (a test's StringIO): nothing to flush into the pipe
        return 1


if __name__ == "__main__":
    sys.exit(main())
