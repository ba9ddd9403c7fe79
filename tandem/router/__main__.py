"""``python -m tandem.router``: run the router (see tandem/router/cli.py)."""

import sys

from tandem.router.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
