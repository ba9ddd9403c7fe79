"""``python -m bench.vs_llama_cpp``: the comparison (compare.py)."""

import sys

from bench.vs_llama_cpp.compare import main

sys.exit(main())
