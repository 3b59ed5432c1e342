"""Detectron's published Mask R-CNN files (its MODEL_ZOO.md and projects/GN/README.md), one row each; the configs'
keys are written here (Detectron's own yaml configs are not at hand)."""

from __future__ import annotations

from . import ZooFile

_SOURCE = "Detectron's MODEL_ZOO.md and projects/GN/README.md (URL, AP); Detectron publishes no digests"
_URL = ("https://dl.fbaipublicfiles.com/detectron/{}/output/train/coco_2014_train%3Acoco_2014_valminusminival/"
        "generalized_rcnn/model_final.pkl")
_R50, _R101 = {"MODEL.RESNETS.DEPTH": 50}, {"MODEL.RESNETS.DEPTH": 101}
_X101 = {**_R101, "MODEL.RESNETS.STRIDE_IN_1X1": False}  # FAIR's ResNeXt ImageNet models: stride in the 3x3
_X101_64X4D = {**_X101, "MODEL.RESNETS.NUM_GROUPS": 64, "MODEL.RESNETS.WIDTH_PER_GROUP": 4}
_X101_32X8D = {**_X101, "MODEL.RESNETS.NUM_GROUPS": 32, "MODEL.RESNETS.WIDTH_PER_GROUP": 8}
_BN, _GN = "Base-Detectron.yaml", "Base-Detectron-GN.yaml"
_TWICE = "The 1x model's network trained twice as long; at test time the same as {}.yaml ({})."
_X64, _X32 = ("ResNeXt-101, 64 groups of width 4 in the 3x3 convs, stride in the 3x3",
              "ResNeXt-101, 32 groups of width 8 in the 3x3 convs, stride in the 3x3")

# Detectron's config (under its configs/), URL part, box AP, mask AP, base, keys, note
_ROWS = [
    ("12_2017_baselines/e2e_mask_rcnn_R-50-FPN_1x.yaml",
     "35858933/12_2017_baselines/e2e_mask_rcnn_R-50-FPN_1x.yaml.01_48_14.DzEQe4wC", 37.7, 33.9, _BN, _R50, ""),
    ("12_2017_baselines/e2e_mask_rcnn_R-50-FPN_2x.yaml",
     "35859007/12_2017_baselines/e2e_mask_rcnn_R-50-FPN_2x.yaml.01_49_07.By8nQcCH", 38.6, 34.5, _BN, _R50, ""),
    ("12_2017_baselines/e2e_mask_rcnn_R-101-FPN_1x.yaml",
     "35861795/12_2017_baselines/e2e_mask_rcnn_R-101-FPN_1x.yaml.02_31_37.KqyEK4tT", 40.0, 35.9, _BN, _R101, ""),
    ("12_2017_baselines/e2e_mask_rcnn_R-101-FPN_2x.yaml",
     "35861858/12_2017_baselines/e2e_mask_rcnn_R-101-FPN_2x.yaml.02_32_51.SgT4y1cO", 40.9, 36.4, _BN, _R101, ""),
    ("12_2017_baselines/e2e_mask_rcnn_X-101-64x4d-FPN_1x.yaml",
     "36494496/12_2017_baselines/e2e_mask_rcnn_X-101-64x4d-FPN_1x.yaml.07_50_11.fkwVtEvg", 42.4, 37.5, _BN,
     _X101_64X4D, f"{_X64} (Facebook ResNeXt ImageNet models)."),
    ("12_2017_baselines/e2e_mask_rcnn_X-101-64x4d-FPN_2x.yaml",
     "35859745/12_2017_baselines/e2e_mask_rcnn_X-101-64x4d-FPN_2x.yaml.02_00_30.ESWbND2w", 42.2, 37.2, _BN,
     _X101_64X4D, _TWICE.format("e2e_mask_rcnn_X-101-64x4d-FPN_1x", _X64)),
    ("12_2017_baselines/e2e_mask_rcnn_X-101-32x8d-FPN_1x.yaml",
     "36761843/12_2017_baselines/e2e_mask_rcnn_X-101-32x8d-FPN_1x.yaml.06_35_59.RZotkLKI", 42.1, 37.3, _BN,
     _X101_32X8D, f"{_X32}."),
    ("12_2017_baselines/e2e_mask_rcnn_X-101-32x8d-FPN_2x.yaml",
     "36762092/12_2017_baselines/e2e_mask_rcnn_X-101-32x8d-FPN_2x.yaml.06_37_59.DM5gJYRF", 41.7, 36.9, _BN,
     _X101_32X8D, _TWICE.format("e2e_mask_rcnn_X-101-32x8d-FPN_1x", _X32)),
    ("gn_baselines/e2e_mask_rcnn_R-50-FPN_2x_gn.yaml",
     "GN/48616381/04_2018_gn_baselines/e2e_mask_rcnn_R-50-FPN_2x_gn_0416.13_23_38.bTlTI97Q", 40.3, 35.7, _GN, _R50,
     "A GN baseline (projects/GN)."),
    ("gn_baselines/e2e_mask_rcnn_R-50-FPN_3x_gn.yaml",
     "GN/48734751/04_2018_gn_baselines/e2e_mask_rcnn_R-50-FPN_3x_gn_0417.09_54_59.nwCTtPVk", 40.8, 36.1, _GN, _R50,
     "A GN baseline (projects/GN, the 270k-iteration schedule): at test time the same as "
     "e2e_mask_rcnn_R-50-FPN_2x_gn.yaml."),
    ("gn_baselines/e2e_mask_rcnn_R-101-FPN_2x_gn.yaml",
     "GN/48616724/04_2018_gn_baselines/e2e_mask_rcnn_R-101-FPN_2x_gn_0416.13_26_34.GLnri4GR", 41.8, 36.8, _GN, _R101,
     "A GN baseline (projects/GN)."),
    ("gn_baselines/e2e_mask_rcnn_R-101-FPN_3x_gn.yaml",
     "GN/48734779/04_2018_gn_baselines/e2e_mask_rcnn_R-101-FPN_3x_gn_0417.09_55_23.HMtcR8wg", 42.3, 37.2, _GN, _R101,
     "A GN baseline (projects/GN)."),
]

ROWS = tuple(
    ZooFile(f"detectron/{config.rpartition('/')[2].removesuffix('.yaml')}", config, _URL.format(part), box, mask,
            _SOURCE, filename=f"{config.rpartition('/')[2].removesuffix('.yaml')}.pkl", base=base, keys=keys,
            note=note)
    for config, part, box, mask, base, keys, note in _ROWS
)
