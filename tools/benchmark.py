"""Weight-free speed benchmark: ``minidet bench``, as a script of the checkout
(src/minidet/apps/bench/benchmark.py)."""

import sys

from _apps import main

if __name__ == "__main__":
    sys.exit(main("benchmark"))
