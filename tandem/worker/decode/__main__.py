"""``python -m tandem.worker.decode``."""

import sys

from tandem.worker.decode.cli import main

sys.exit(main())
