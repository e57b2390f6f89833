"""``python -m fedcore`` runs the CLI."""

import sys

from fedcore.cli import main

sys.exit(main())
