"""``python -m tandem.worker.dual``."""

import sys

from tandem.worker.dual.cli import main

sys.exit(main())
