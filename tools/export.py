"""Export to ONNX with a parity gate: ``minidet export``, as a script of the checkout
(src/minidet/apps/export/program.py)."""

import sys

from _apps import main

if __name__ == "__main__":
    sys.exit(main("export"))
