"""COCO box and mask AP: ``minidet eval``, as a script of the checkout (src/minidet/apps/eval_coco.py)."""

import sys

from _apps import main

if __name__ == "__main__":
    sys.exit(main("eval_coco"))
