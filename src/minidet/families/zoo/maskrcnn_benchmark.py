"""maskrcnn-benchmark's published Mask R-CNN files (its MODEL_ZOO.md), one row each; the configs' keys are written
here (maskrcnn-benchmark's own yaml configs are not at hand)."""

from __future__ import annotations

from . import ZooFile

_SOURCE = "maskrcnn-benchmark's MODEL_ZOO.md (URL, AP); maskrcnn-benchmark publishes no digests"
_URL = "https://download.pytorch.org/models/maskrcnn/{}.pth"
_BASE = "Base-maskrcnn-benchmark.yaml"

# its config (under its configs/; the file's name too), box AP, mask AP, keys, note
_ROWS = [
    ("e2e_mask_rcnn_R_50_FPN_1x", 37.8, 34.2, {"MODEL.RESNETS.DEPTH": 50}, "Model zoo id 6358792."),
    ("e2e_mask_rcnn_R_101_FPN_1x", 40.1, 36.1, {"MODEL.RESNETS.DEPTH": 101}, "Model zoo id 6358805."),
    ("e2e_mask_rcnn_X_101_32x8d_FPN_1x", 42.2, 37.8,
     {"MODEL.RESNETS.DEPTH": 101, "MODEL.RESNETS.STRIDE_IN_1X1": False, "MODEL.RESNETS.NUM_GROUPS": 32,
      "MODEL.RESNETS.WIDTH_PER_GROUP": 8},
     "Model zoo id 6358718: ResNeXt-101, 32 groups of width 8 in the 3x3 convs, stride in the 3x3."),
]

ROWS = tuple(
    ZooFile(f"maskrcnn_benchmark/{config}", f"configs/{config}.yaml", _URL.format(config), box, mask, _SOURCE,
            base=_BASE, keys=keys, note=note)
    for config, box, mask, keys, note in _ROWS
)
