"""Load benchmark of a running server: ``minidet bench-serve``, as a script of the checkout
(src/minidet/apps/serve/load.py)."""

import sys

from _apps import main

if __name__ == "__main__":
    sys.exit(main("bench_serve"))
