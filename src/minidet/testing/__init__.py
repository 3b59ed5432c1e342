"""Test support: not part of the engine or of the programs; used by the tests and ``tools/golden.py``.

Nothing in ``minidet`` outside this package imports it, and nothing here runs with a real checkpoint:

- ``checkpoints``: synthetic Detectron (Caffe2) ``.pkl`` files, detectron2 state dicts, maskrcnn-benchmark
  training files.
- ``mmdet``: synthetic mmdetection files.

What the programs use as well lives in shipped code: structured pictures and realistic random weights
(``minidet.apps.synthetic``), torchvision's reference model (``minidet.apps.bench.reference``), the "same
detections" verdict (``minidet.apps.compare``).
"""
