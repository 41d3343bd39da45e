"""``python -m keyrank.evaluation ...`` = ``keyrank eval ...``."""

import sys

from keyrank.evaluation.cli import main

sys.exit(main())
