"""torchvision's published Mask R-CNN files (its weights enums), one row each; the configs' keys are written here
(torchvision's builders are code, not configs)."""

from __future__ import annotations

from . import ZooFile

_SOURCE = "torchvision's weights table (URL, AP); full SHA-256 and size as pinned for these URLs (weights/README.md)"
_URL = "https://download.pytorch.org/models/{}"

ROWS = (
    ZooFile("torchvision/maskrcnn_resnet50_fpn", "MaskRCNN_ResNet50_FPN_Weights.COCO_V1",
            _URL.format("maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth"), 37.9, 34.6, _SOURCE,
            sha256="bf2d0c1efbc936eeee2bc95a48e80ebc86b891f61b0106485937fc29f9315fc0", size=178_090_079,
            base="../Base-RCNN-FPN.yaml",
            keys={"MODEL.FROZEN_BN_EPS": 0.0, "MODEL.PIXEL_MEAN": [0.485, 0.456, 0.406],
                  "MODEL.PIXEL_STD": [0.229, 0.224, 0.225], "MODEL.CATEGORY_LAYOUT": "coco91",
                  "MODEL.ROI_HEADS.NUM_CLASSES": 91, "INPUT.FORMAT": "RGB", "INPUT.PIXEL_RANGE": 1.0},
            note="torchvision runs these weights with FrozenBatchNorm eps 0.0 (overwrite_eps), so must we."),
    ZooFile("torchvision/maskrcnn_resnet50_fpn_v2", "MaskRCNN_ResNet50_FPN_V2_Weights.COCO_V1",
            _URL.format("maskrcnn_resnet50_fpn_v2_coco-73cbd019.pth"), 47.4, 41.8, _SOURCE,
            sha256="73cbd0190fcbe3ba339921fbce2c3a0b6bb9126c9a133c85e43a2a8e060a109e", size=185_828_065,
            base="maskrcnn_resnet50_fpn.yaml",
            keys={"MODEL.FROZEN_BN_EPS": 1e-5, "MODEL.FPN.USE_NORM": True, "MODEL.RPN.CONV_DEPTH": 2,
                  "MODEL.ROI_BOX_HEAD.NUM_CONV": 4, "MODEL.ROI_BOX_HEAD.NUM_FC": 1,
                  "MODEL.ROI_BOX_HEAD.USE_NORM": True, "MODEL.ROI_MASK_HEAD.USE_NORM": True},
            note="Batch norm (eps 1e-5) in backbone, FPN and heads; 2-conv RPN head; 4conv+1fc box head."),
)
