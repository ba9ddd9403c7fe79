"""``python -m prefill_worker``."""

import sys

from prefill_worker.cli import main

sys.exit(main())
