"""``workbench trace run|check``: simulate, replay and check a serving trace; or check a recorded one.

    workbench trace run --profile vllm --steps 2000 --spec 2 --mixed --out trace.jsonl   # metadata as used
    workbench trace run --profile sglang --steps 2000 --prefix-cache no_buffer
    workbench trace run --profile sglang --steps 2000 --spec 2 --prefix-cache extra_buffer
    workbench trace run --profile vllm --steps 2000 --prefix-cache align
    workbench trace run --profile sglang --spec 3 --topk 2 --steps 400             # sglang's draft trees
    workbench trace run --scheduler vllm --spec 3 --steps 300 --out vllm.jsonl    # vLLM's own scheduler
    workbench trace run --scheduler sglang --spec 2 --prefix-cache extra_buffer   # sglang's own scheduler
    workbench trace check trace.jsonl

Exit codes: 0 every step clean; 1 a divergence (one line each, the first first) or a trace that replays
nothing; 2 bad input (a malformed line names its line number and field; an unknown version or profile
says so). Importing this module costs no torch: ``workbench trace --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workbench.layer_names import DEFAULT_LAYER, LAYER_NAMES
from workbench.profiles import PROFILES as _PROFILES

SUMMARY = "simulate a scheduler's steps (or read a recorded trace) and check every step across steps"
EXAMPLE = "workbench trace run --profile vllm --steps 2000 --spec 2 --mixed"
PROFILES = tuple(_PROFILES)
SCHEDULERS = {
    "vllm": ("workbench.engines.vllm_scheduler", "run_vllm_scheduler", "vllm"),
    "sglang": ("workbench.engines.sglang_scheduler", "run_sglang_scheduler", "sglang"),
}
"""``--scheduler`` other than ``sim``: the engine's own scheduling code on the CPU (module, function, profile);
the engine is imported only when one runs (``make engines`` installs them)."""
PREFIX_CACHES = tuple(dict.fromkeys(name for p in _PROFILES.values() for name in p.prefix_caches))
"""The strategies some profile has (``Profile.prefix_caches``): ``workbench.traces.strategies.STRATEGIES``'
names, read without importing torch (``tests/traces/test_sim_config.py`` holds them equal)."""


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{value} is out of range: expected an int in [1, 1000000]")
    return value


def _draft(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not 0 <= value <= 16:
        raise argparse.ArgumentTypeError(f"{value} is out of range: expected an int in [0, 16] (0: no speculation)")
    return value


def _topk(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not 1 <= value <= 16:
        raise argparse.ArgumentTypeError(f"{value} is out of range: expected an int in [1, 16] (1: chains)")
    return value


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``run`` and ``check`` to ``parser``."""
    parser.description = f"{SUMMARY}. Exit 0: clean; 1: a divergence, or nothing replayed; 2: bad input."
    sub = parser.add_subparsers(dest="trace_command", required=True, metavar="{run,check}")
    run = sub.add_parser("run", help="simulate a scheduler, replay every step, check, and write the trace")
    run.add_argument(
        "--scheduler",
        choices=("sim", *SCHEDULERS),
        default="sim",
        help="who schedules the steps: the workbench's simulator (sim, the default: fast, no engine), or the "
        "installed engine's own scheduler and cache code run on the CPU (vllm, sglang)",
    )
    run.add_argument(
        "--engine-root",
        metavar="DIR",
        help="with --scheduler vllm|sglang: import the engine from this tree (a clone, an unpacked wheel)",
    )
    run.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="the engine's conventions (default sglang; a real scheduler's own engine)",
    )
    run.add_argument("--layer", choices=LAYER_NAMES, default=DEFAULT_LAYER, help="the layer the steps run")
    run.add_argument("--steps", type=_count, default=200, metavar="N", help="scheduler steps")
    run.add_argument("--seed", type=int, default=0, help="the simulation's seed")
    run.add_argument("--spec", type=_draft, default=0, metavar="D", help="speculate D draft tokens (0: none)")
    run.add_argument(
        "--topk",
        type=_topk,
        default=1,
        metavar="K",
        help="with --spec: draft trees, each node at most K children (sglang's speculative_eagle_topk; 1: chains, "
        "the default); each verify row draws a tree and accepts a root-to-node path (sglang profiles: vLLM "
        "removed tree drafts)",
    )
    run.add_argument(
        "--mixed",
        action="store_true",
        help="mixed steps: extend rows beside decode rows (with --spec: vLLM's verify rows; sglang's 1-token "
        "decode tails)",
    )
    run.add_argument("--dp-dummies", action="store_true", help="idle steps of a data-parallel rank with no work")
    run.add_argument(
        "--prefix-cache",
        choices=PREFIX_CACHES,
        default=None,
        help="a prefix cache of recurrent states: sglang's mamba radix cache, no_buffer or extra_buffer (ping-pong "
        "track buffers) (sglang profiles), or vLLM's block-aligned align (profile vllm); rows carry their token "
        "ids, steps the cache's hits, copies, moves, checkpoints and evictions "
        "(extra_buffer: and sglang's mamba_track_* fields)",
    )
    run.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="write the trace (JSON Lines) here, each replayed step's metadata as the step used it",
    )
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    check = sub.add_parser("check", help="replay a recorded trace and check it against the profile and the reference")
    check.add_argument("file", metavar="FILE", help="a trace file (JSON Lines; docs/traces.md)")
    check.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def _progress(total: int) -> Any:
    if total < 500 or not sys.stderr.isatty():
        return None

    def show(done: int, total: int = total) -> None:
        if done % 100 == 0 or done == total:
            width = 30
            filled = width * done // total
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} steps")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    """Run a parsed command line; prints the result and returns the exit code (bad input raises WorkbenchError)."""
    from workbench.errors import WorkbenchError
    from workbench.traces.format import read_trace, write_trace
    from workbench.traces.replay import replay_trace
    from workbench.traces.simulate import simulate

    out = args.out if args.trace_command == "run" else None
    if args.trace_command == "run" and args.scheduler == "sim" and args.engine_root:
        raise WorkbenchError(
            f"--engine-root {args.engine_root}: only with --scheduler vllm or sglang (sim imports none)"
        )
    if args.trace_command == "run" and args.scheduler != "sim":
        trace = read_trace(_real_scheduler(args).lines())
    elif args.trace_command == "run":
        trace = simulate(
            args.profile or "sglang",
            args.layer,
            steps=args.steps,
            seed=args.seed,
            spec=args.spec,
            topk=args.topk,
            mixed=args.mixed,
            dp_dummies=args.dp_dummies,
            prefix_cache=args.prefix_cache,
        )
    else:
        trace = read_trace(args.file)
    progress = _progress(len(trace.steps))
    recorded = None
    try:
        if out:  # each step the replay runs is written with its metadata as the step used it
            result = replay_trace(trace, progress=progress, record=True)
            recorded = result.recorded
        else:
            result = replay_trace(trace, progress=progress)
    finally:  # the trace is written whatever the replay found (as simulated, where the replay raised)
        if out:
            write_trace(recorded if recorded is not None else trace, out)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result)
    return 0 if result.ok else 1


def _real_scheduler(args: argparse.Namespace) -> Any:
    """Run the engine's own scheduler (``--scheduler vllm|sglang``); options it cannot take are refused."""
    import importlib

    from workbench.engines.versions import EngineError

    module, function, engine = SCHEDULERS[args.scheduler]
    if args.profile not in (None, engine):
        raise EngineError(f"--profile {args.profile}: --scheduler {args.scheduler} writes {engine}'s traces")
    if args.dp_dummies:
        raise EngineError(f"--dp-dummies: the {args.scheduler} scheduler has no idle data-parallel rank here")
    if args.topk != 1:
        raise EngineError(
            f"--topk {args.topk}: the {args.scheduler} scheduler's driver records chains (its dumper refuses "
            "speculative trees); draft trees come from --scheduler sim"
        )
    if args.engine_root:
        from workbench.engines.identity import use_tree

        print(use_tree(engine, args.engine_root))
    options: dict[str, Any] = {"steps": args.steps, "seed": args.seed, "spec": args.spec, "layer": args.layer}
    if args.prefix_cache is not None:
        options["prefix_cache"] = args.prefix_cache
    if args.scheduler == "vllm":
        if args.mixed:
            raise EngineError("--mixed: vLLM's scheduler mixes prefill, decode and verify rows by itself")
    else:
        options["mixed"] = args.mixed
    try:
        return getattr(importlib.import_module(module), function)(**options)
    except SystemExit as e:  # engine code that exits must not end the run as if it had finished (exit 0)
        raise EngineError(f"--scheduler {args.scheduler}: the engine's code exited (SystemExit({e.code!r}))") from None
