"""How a user runs ``tandem`` from their shell on this machine (for the commands we print).

``make serve`` installs into ``.venv`` without activating it, so a bare ``tandem`` is often
not on PATH: print what works when pasted.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def tandem_command() -> str:
    """``tandem`` when PATH finds this installation's, else its path, else ``python -m``."""
    here = Path(sys.executable).parent / "tandem"
    found = shutil.which("tandem")
    if found is not None and (not here.exists() or Path(found).resolve() == here.resolve()):
        return "tandem"
    if here.exists() and os.access(here, os.X_OK):
        try:
            return shlex.quote(os.path.relpath(here))
        except ValueError:  # another drive (Windows)
            return shlex.quote(str(here))
    return f"{shlex.quote(sys.executable)} -m tandem.cli.main"
