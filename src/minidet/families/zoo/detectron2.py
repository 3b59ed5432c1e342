"""detectron2's published Mask R-CNN files (its MODEL_ZOO.md), one row each: the shipped configs are made from
detectron2's own config files (``tools/zoo_configs.py``: its sources in ../shared/reference, the ``reference``
extra) with the keys and notes below."""

from __future__ import annotations

from . import ZooFile

_SOURCE = "detectron2's MODEL_ZOO.md (URL, AP); detectron2 publishes no digests"
_URL = "https://dl.fbaipublicfiles.com/detectron2/{}/{}/{}"
_ZOO = [  # zoo config (under detectron2's configs/), model id, published file, box AP, mask AP
    ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml", 137260431, "model_final_a54504.pkl", 38.6, 35.2),
    ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml", 137849600, "model_final_f10217.pkl", 41.0, 37.2),
    ("COCO-InstanceSegmentation/mask_rcnn_R_101_FPN_3x.yaml", 138205316, "model_final_a3ec72.pkl", 42.9, 38.6),
    ("COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x.yaml", 139653917, "model_final_2d9806.pkl", 44.3, 39.5),
    ("new_baselines/mask_rcnn_R_50_FPN_100ep_LSJ.py", 42047764, "model_final_bb69de.pkl", 44.6, 40.3),
    ("new_baselines/mask_rcnn_R_50_FPN_200ep_LSJ.py", 42047638, "model_final_89a8d3.pkl", 46.3, 41.7),
    ("new_baselines/mask_rcnn_R_50_FPN_400ep_LSJ.py", 42019571, "model_final_14d201.pkl", 47.4, 42.5),
    ("new_baselines/mask_rcnn_R_101_FPN_100ep_LSJ.py", 42025812, "model_final_4f7b58.pkl", 46.4, 41.6),
    ("new_baselines/mask_rcnn_R_101_FPN_200ep_LSJ.py", 42131867, "model_final_0bb7ae.pkl", 48.0, 43.1),
    ("new_baselines/mask_rcnn_R_101_FPN_400ep_LSJ.py", 42073830, "model_final_f96b26.pkl", 48.9, 43.7),
    ("COCO-PanopticSegmentation/panoptic_fpn_R_50_1x.yaml", 139514544, "model_final_dbfeb4.pkl", 37.6, 34.7),
    ("COCO-PanopticSegmentation/panoptic_fpn_R_50_3x.yaml", 139514569, "model_final_c10459.pkl", 40.0, 36.5),
    ("COCO-PanopticSegmentation/panoptic_fpn_R_101_3x.yaml", 139514519, "model_final_cafdb1.pkl", 42.4, 38.5),
    ("LVISv0.5-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml", 144219072, "model_final_571f7c.pkl", 23.6, 24.4),
    ("LVISv0.5-InstanceSegmentation/mask_rcnn_R_101_FPN_1x.yaml", 144219035, "model_final_824ab5.pkl", 25.6, 25.9),
    ("LVISv0.5-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_1x.yaml", 144219108, "model_final_5e3439.pkl", 26.7,
     27.1),
    ("Cityscapes/mask_rcnn_R_50_FPN.yaml", 142423278, "model_final_af9cf5.pkl", None, 36.5),  # no box AP published
    ("Misc/mask_rcnn_R_50_FPN_3x_gn.yaml", 138602888, "model_final_dc5d9e.pkl", 42.6, 38.6),
    ("Misc/mask_rcnn_R_50_FPN_3x_syncbn.yaml", 169527823, "model_final_3b3c51.pkl", 41.9, 37.8),
    ("Misc/scratch_mask_rcnn_R_50_FPN_3x_gn.yaml", 138602908, "model_final_01ca85.pkl", 39.9, 36.6),
    ("Misc/scratch_mask_rcnn_R_50_FPN_9x_gn.yaml", 183808979, "model_final_da7b4c.pkl", 43.7, 39.6),
    ("Misc/scratch_mask_rcnn_R_50_FPN_9x_syncbn.yaml", 184226666, "model_final_5ce33e.pkl", 43.6, 39.3),
    ("Misc/mask_rcnn_R_50_FPN_1x_dconv_c3-c5.yaml", 138602867, "model_final_65c703.pkl", 41.5, 37.5),
    ("Misc/mask_rcnn_R_50_FPN_3x_dconv_c3-c5.yaml", 144998336, "model_final_821d0b.pkl", 42.7, 38.5),
    ("Misc/cascade_mask_rcnn_R_50_FPN_1x.yaml", 138602847, "model_final_e9d89b.pkl", 42.1, 36.4),
    ("Misc/cascade_mask_rcnn_R_50_FPN_3x.yaml", 144998488, "model_final_480dd8.pkl", 44.3, 38.5),
    ("Misc/panoptic_fpn_R_101_dconv_cascade_gn_3x.yaml", 139797668, "model_final_be35db.pkl", 47.4, 41.3),
    ("Misc/cascade_mask_rcnn_X_152_32x8d_FPN_IN5k_gn_dconv.yaml", 18131413, "model_0039999_e76410.pkl", 50.2, 44.0),
    ("new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ.py", 42047771, "model_final_b7fbab.pkl", 46.0, 41.3),
    ("new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_200ep_LSJ.py", 42132721, "model_final_5d87c1.pkl", 48.1, 43.1),
    ("new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_400ep_LSJ.py", 42025447, "model_final_f1362d.pkl", 48.6, 43.5),
    ("new_baselines/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ.py", 42047784, "model_final_6ba57e.pkl", 46.1, 41.6),
    ("new_baselines/mask_rcnn_regnety_4gf_dds_FPN_200ep_LSJ.py", 42047642, "model_final_27b9c1.pkl", 47.8, 43.0),
    ("new_baselines/mask_rcnn_regnety_4gf_dds_FPN_400ep_LSJ.py", 42045954, "model_final_ef3a80.pkl", 48.2, 43.3),
]
_PREFIX = {"LVISv0.5-InstanceSegmentation": "lvis_v0.5_", "Cityscapes": "cityscapes_"}  # their names repeat COCO's


def _name(zoo: str) -> str:
    """The registry's (and the shipped config's) name of the zoo config ``zoo``."""
    folder, _, file = zoo.rpartition("/")
    return f"detectron2/{_PREFIX.get(folder, '')}{file.rpartition('.')[0]}"


# the config keys beside what the zoo config says: the class names of a dataset other than COCO
KEYS = {
    "cityscapes_mask_rcnn_R_50_FPN":
        {"MODEL.CLASS_NAMES": ["person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle"]},
}
# what the shipped configs' comment says of a file beyond its zoo config's name: (note, the files it is of)
_NOTES = [
    ('ResNeXt-101, 32 groups of width 8 in the 3x3 convs, stride in the 3x3 and the pixel standard deviation of '
     "its ImageNet model (a Caffe2-trained one, as detectron2's config says).",
     ("mask_rcnn_X_101_32x8d_FPN_3x",)),
    ("Panoptic FPN's instance half: the box and mask heads; the semantic head's keys (sem_seg_head) are set aside "
     'by name at load time (no instance detection reads them).',
     ("panoptic_fpn_R_50_1x", "panoptic_fpn_R_50_3x", "panoptic_fpn_R_101_3x")),
    ('LVIS v0.5: 1230 classes (category ids 1 to 1230 in class order), score threshold 0.0001, 300 detections.',
     ("lvis_v0.5_mask_rcnn_R_50_FPN_1x", "lvis_v0.5_mask_rcnn_R_101_FPN_1x",
      "lvis_v0.5_mask_rcnn_X_101_32x8d_FPN_1x")),
    ("Cityscapes' 8 instance classes, tested at short side 1024, long side at most 2048.",
     ("cityscapes_mask_rcnn_R_50_FPN",)),
    ('Trained from scratch (no ImageNet weights); the test-time network is that of its base.',
     ("scratch_mask_rcnn_R_50_FPN_3x_gn", "scratch_mask_rcnn_R_50_FPN_9x_gn",
      "scratch_mask_rcnn_R_50_FPN_9x_syncbn")),
    ("Panoptic FPN's instance half: the box and mask heads; the semantic head's keys (sem_seg_head) are set aside "
     "by name at load time (no instance detection reads them). Its ResNet-101 (from FAIR's ImageNet GN model: "
     'stride in the 3x3 conv) has GroupNorm and deformable convolution (v1) in res3 to res5, its FPN and mask head'
     " GroupNorm; the box head is the cascade's, two fcs without a norm.",
     ("panoptic_fpn_R_101_dconv_cascade_gn_3x",)),
    ("ResNeXt-152 32x8d (FAIR's ImageNet-5k model: stride in the 3x3 conv) with frozen batch norm (detectron2's "
     'default RESNETS.NORM, run as its F.batch_norm: MODEL.NORM BN) and deformable convolution (v1) in res3 to '
     "res5; an FPN without a norm; GroupNorm only in the heads (MODEL.HEAD_NORM): the cascade's box stages each "
     'four 3x3 convs and one fc, the mask head eight convs.',
     ("cascade_mask_rcnn_X_152_32x8d_FPN_IN5k_gn_dconv",)),
    ('RegNetX-4GF: RegNet(depth 23, w_a 38.65, w_0 96, w_m 2.43, group width 40).',
     ("mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ", "mask_rcnn_regnetx_4gf_dds_FPN_200ep_LSJ",
      "mask_rcnn_regnetx_4gf_dds_FPN_400ep_LSJ")),
    ('RegNetY-4GF: RegNet(depth 22, w_a 31.41, w_0 96, w_m 2.24, group width 64, se_ratio 0.25): '
     'squeeze-and-excitation after the 3x3 conv of each block.',
     ("mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ", "mask_rcnn_regnety_4gf_dds_FPN_200ep_LSJ",
      "mask_rcnn_regnety_4gf_dds_FPN_400ep_LSJ")),
]
NOTES = {name: note for note, names in _NOTES for name in names}

ROWS = tuple(
    ZooFile(_name(zoo), zoo, _URL.format(zoo.rpartition(".")[0], model_id, file), box, mask, _SOURCE,
            filename=f"{_name(zoo).partition('/')[2]}.pkl", keys=KEYS.get(_name(zoo).partition("/")[2], {}),
            note=NOTES.get(_name(zoo).partition("/")[2], ""))
    for zoo, model_id, file, box, mask in _ZOO
)
