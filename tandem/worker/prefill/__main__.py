"""``python -m tandem.worker.prefill``."""

import sys

from tandem.worker.prefill.cli import main

sys.exit(main())
