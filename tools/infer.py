"""Mask R-CNN over images and videos: ``minidet infer``, as a script of the checkout (src/minidet/apps/infer.py)."""

import sys

from _apps import main

if __name__ == "__main__":
    sys.exit(main("infer"))
