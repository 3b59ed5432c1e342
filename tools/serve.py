"""A model behind HTTP: ``minidet serve``, as a script of the checkout (src/minidet/apps/serve/program.py)."""

import sys

from _apps import main

if __name__ == "__main__":
    sys.exit(main("serve"))
