"""``python -m router``: run the router (see router/cli.py)."""

import sys

from router.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
