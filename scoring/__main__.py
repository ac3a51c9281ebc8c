"""`python -m scoring ...`: the scorer as its own process (no harness code is imported)."""

import sys

from scoring.score.cli import main

sys.exit(main())
