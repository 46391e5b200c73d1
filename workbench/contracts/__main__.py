"""``python -m workbench.contracts``: the same as ``workbench check-contracts``."""

from workbench.contracts.cli import main

raise SystemExit(main())
