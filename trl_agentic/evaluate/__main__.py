"""``python -m trl_agentic.evaluate``: the command line of :mod:`trl_agentic.evaluate.cli`."""

from .cli import main

raise SystemExit(main())
