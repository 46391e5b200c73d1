"""``workbench engine-check ENGINE``: the installed engine's own backend, as oracle and as subject.

    workbench engine-check sglang                                   # the engine's GDN backend
    workbench engine-check sglang --file my_ascend_backend.py:AscendMamba2AttnBackend
    workbench engine-check vllm --layer mamba2 --batches 1000 --json
    workbench engine-check sglang --engine-root ~/src/sglang          # a clone: unverified, judged by probes
    workbench engine-check sglang --topk 2                          # tree drafts: random trees of 4 tokens

Exit codes: 0 when capture, replay and the metadata agree with the profile and integrity holds; 1 on a
divergence or an engine error (the call, the ``TypeError``, the batch); 2 for bad input (an engine that is
not there, a probe the engine fails, a spec that does not load, a class of another engine).

The engine is the installed one, or the tree ``--engine-root DIR`` names (a clone of the engine's repository,
``pip install -e``'d or not, or an unpacked wheel): its version and commit are the tree's. A verified release
runs on its own adapter; any other build on the newest adapter once its probes pass, reported "unverified:
probes passed" with its version and commit; there a divergence from the profile says the engine's behaviour
changed.

``--topk K`` (K > 1, sglang only: vLLM removed tree attention and refuses it) verifies random draft trees of
``2K`` tokens per row instead of chains: the engine's tree links and the parents its own conv kernel derives
from them (run in Triton's interpreter: ``TRITON_INTERPRET=1`` is set unless already set) are compared with the
profile's, and a class whose verify kernels get nothing of the tree is reported (exit 1).

Importing this module costs no torch: ``workbench engine-check --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from workbench.engine_versions import ENGINE_NAMES, releases
from workbench.layer_names import DEFAULT_LAYER, LAYER_NAMES

SUMMARY = "run the installed engine's own metadata backend as oracle (vs the profile) and subject (capture, replay)"
EXAMPLE = "workbench engine-check sglang --file my_ascend_backend.py:AscendMamba2AttnBackend"
MODES = ("decode", "target_verify", "extend", "idle")


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the engine-check arguments to ``parser``."""
    parser.description = (
        f"{SUMMARY}. Exit 0: capture, replay and the metadata agree with the profile and integrity holds; "
        "1: a divergence or an engine error (the call, the TypeError, the batch); 2: bad input."
    )
    verified = "; ".join(releases(name) for name in ENGINE_NAMES)
    parser.add_argument(
        "engine",
        choices=ENGINE_NAMES,
        help=f"the engine (verified: {verified}; make engines installs the newest; other builds run once their "
        "probes pass)",
    )
    parser.add_argument(
        "--engine-root",
        metavar="DIR",
        help="import the engine from this tree (a clone: DIR/python/sglang or DIR/vllm; an unpacked wheel)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--backend", metavar="MODULE:CLASS", help="a backend class importable by module name")
    which.add_argument("--file", metavar="PATH:CLASS", help="a backend class in a .py file (a modified engine file)")
    parser.add_argument("--layer", choices=LAYER_NAMES, default=DEFAULT_LAYER, help="which of the engine's backends")
    parser.add_argument(
        "--runner",
        choices=("v2", "v1"),
        default=None,
        help="vllm: the model runner whose metadata path is emulated (default v2, vLLM's default since 0.31; v2 "
        "also checks a second KV-cache group's update_block_table against build())",
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), metavar="M,M", help=f"comma-separated, from {', '.join(MODES)}"
    )
    parser.add_argument(
        "--topk",
        type=_topk,
        default=1,
        metavar="K",
        help=f"speculative branching factor: 1 verifies chains of 2 drafts (default); K in 2..{MAX_TOPK} random "
        "draft trees of 2K tokens (sglang; vLLM verifies chains only). The parents come from sglang's own conv "
        "kernel in Triton's interpreter: slower, use --batches to size it",
    )
    parser.add_argument("--batches", type=_positive, default=200, metavar="N", help="random batches per mode")
    parser.add_argument("--seed", type=int, default=0, help="the batches' seed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    return parser


def behaviour_changed(ident: Any) -> str:
    """The line an unverified engine's divergence adds: the engine's behaviour changed since the release its
    adapter was verified on."""
    return (
        f"{ident.name} {ident.version} is not a verified release: where it diverges from the profile above, the "
        f"engine's behaviour changed since {ident.name} {ident.adapter} (the field named is the one that moved)"
    )


MAX_TOPK = 8
"""A tree check runs sglang's conv kernel interpreted, a step per draft token of every row: 2 * 8 tokens a row
keeps a check of the default 200 batches in minutes."""


def _topk(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not 1 <= value <= MAX_TOPK:
        raise argparse.ArgumentTypeError(
            f"{value} is out of range: expected an int in [1, {MAX_TOPK}] (trees of 2 * topk draft tokens)"
        )
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{value} is out of range: expected an int in [1, 100000]")
    return value


def run(args: argparse.Namespace) -> int:
    """Run a parsed command line; prints the result and returns the exit code (2 raises WorkbenchError)."""
    import workbench.engines as engines
    from workbench.engines.base import EngineError
    from workbench.engines.check import engine_check
    from workbench.loading import load_object

    if args.topk > 1:  # sglang's conv kernel derives the trees' parents; on a CPU it runs interpreted
        os.environ.setdefault("TRITON_INTERPRET", "1")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise EngineError(f"--modes: {', '.join(bad) or repr(args.modes)} not among {', '.join(MODES)}")
    if args.engine_root:
        from workbench.engines.identity import use_tree

        use_tree(args.engine, args.engine_root)
    adapter = engines.adapter_class(args.engine)
    ident = engines.engine_identity(adapter)
    spec = args.backend or args.file
    backend_class: Any = None
    if spec:
        engines.prepare(adapter)  # the engine's stand-ins first: the user's file imports the engine
        backend_class = load_object(spec)
        if not isinstance(backend_class, type):
            raise EngineError(f"{spec!r} is a {type(backend_class).__name__}, not a class")
    result = engine_check(
        adapter,
        backend_class=backend_class,
        layer=args.layer,
        modes=modes,
        batches=args.batches,
        runner=args.runner,
        topk=args.topk,
    )
    changed = None if ident.verified or result.ok else behaviour_changed(ident)
    if args.json:
        out = result.to_dict()
        out["label"], out["engine"] = out.get("engine"), {**ident.to_dict(), "runner": out.pop("runner", None)}
        out["behaviour_changed"] = changed
        print(json.dumps(out, indent=2))
    else:
        print(ident)
        print(result)
        if changed:
            print(changed)
    sys.stdout.flush()
    return 0 if result.ok else 1
