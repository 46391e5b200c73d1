"""``workbench engine-check ENGINE``: the installed engine's own backend, as oracle and as subject.

    workbench engine-check sglang                                   # the engine's GDN backend
    workbench engine-check sglang --file my_ascend_backend.py:AscendMamba2AttnBackend
    workbench engine-check vllm --layer mamba2 --batches 1000 --json

Exit codes: 0 when capture, replay and the metadata agree with the profile and integrity holds; 1 on a
divergence or an engine error (the call, the ``TypeError``, the batch); 2 for bad input (an engine that is
not installed or has no adapter for its version, a spec that does not load, a class of another engine).

Importing this module costs no torch: ``workbench engine-check --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
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
        "engine", choices=ENGINE_NAMES, help=f"the installed engine, at a verified release ({verified}; make engines)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--backend", metavar="MODULE:CLASS", help="a backend class importable by module name")
    which.add_argument("--file", metavar="PATH:CLASS", help="a backend class in a .py file (a modified engine file)")
    parser.add_argument("--layer", choices=LAYER_NAMES, default=DEFAULT_LAYER, help="which of the engine's backends")
    parser.add_argument(
        "--modes", default=",".join(MODES), metavar="M,M", help=f"comma-separated, from {', '.join(MODES)}"
    )
    parser.add_argument("--batches", type=_positive, default=200, metavar="N", help="random batches per mode")
    parser.add_argument("--seed", type=int, default=0, help="the batches' seed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    return parser


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

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise EngineError(f"--modes: {', '.join(bad) or repr(args.modes)} not among {', '.join(MODES)}")
    adapter = engines.adapter_class(args.engine)
    spec = args.backend or args.file
    backend_class: Any = None
    if spec:
        engines.prepare(adapter)  # the engine's stand-ins first: the user's file imports the engine
        backend_class = load_object(spec)
        if not isinstance(backend_class, type):
            raise EngineError(f"{spec!r} is a {type(backend_class).__name__}, not a class")
    result = engine_check(adapter, backend_class=backend_class, layer=args.layer, modes=modes, batches=args.batches)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result)
    sys.stdout.flush()
    return 0 if result.ok else 1
