"""`python -m playground`: the `playground` command."""

from playground.cli import main

raise SystemExit(main())
