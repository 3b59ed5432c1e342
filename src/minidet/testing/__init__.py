"""Test support: not part of the engine; used by the tests, ``tools/golden.py`` and, for its reference models and
weights, the benchmark (``minidet.apps.benchmark``).

Nothing in the engine (every other module of ``minidet``) imports this package, and nothing here
runs with a real checkpoint. It holds what the tests and the benchmark share:

- ``synthetic``: structured images, realistic random weights for minidet's own models.
- ``tvref``: torchvision's Mask R-CNN as the reference: its builder with realistic random weights,
  its default-initialized weights, the published v1 key layout, its stage and step times.
- ``checkpoints``: synthetic Detectron (Caffe2) ``.pkl`` files and detectron2 state dicts.
- ``compare``: the one "same detections" verdict (``compare_detections(...).problem()``).
"""
