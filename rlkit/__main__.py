"""``python -m rlkit ...`` runs the command line (see rlkit.cli)."""

from rlkit.cli import main

raise SystemExit(main())
