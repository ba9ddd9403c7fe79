"""``python -m decode_worker``."""

import sys

from decode_worker.cli import main

sys.exit(main())
