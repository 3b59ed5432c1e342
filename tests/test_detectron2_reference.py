"""minidet's detectron2 configs against detectron2 itself (its sources in ../shared/reference, run by
tests/detectron2_reference.py with the ``reference`` extra's packages): every shipped config computes what its zoo
config computes at test time, read from the zoo's own config file; and a synthetic checkpoint in detectron2's layout
gives ``DefaultPredictor``'s detections, bit for bit, under minidet (MODEL.ROI_ALIGN_IMPL torchvision: the RoIAlign
detectron2 calls; the default gather RoIAlign only reorders float sums)."""

import pickle

import pytest

import minidet
from helpers import assert_bit_identical, config, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.config import body_of, cfg_value, config_names
from minidet.families.detectron2 import ZOO_CONFIGS
from minidet.testing.checkpoints import d2_weights

pytestmark = [needs_extra("fvcore", "reference"), needs_extra("omegaconf", "reference")]


@pytest.fixture(scope="module")
def d2():
    import detectron2_reference

    if not detectron2_reference.SOURCES.is_file():
        pytest.skip(f"needs detectron2's sources: {detectron2_reference.SOURCES}")
    return detectron2_reference


_NORMS = {"FrozenBN": "BN", "BN": "BN", "SyncBN": "BN", "naiveSyncBN": "BN", "GN": "GN"}  # at test time


def _expected(cfg) -> dict:
    """What detectron2's config ``cfg`` computes at test time, as minidet's config keys; fails on any part of its
    network that these keys cannot describe."""
    m = cfg.MODEL
    assert m.META_ARCHITECTURE in ("GeneralizedRCNN", "PanopticFPN") and m.MASK_ON and not m.KEYPOINT_ON
    assert m.BACKBONE.NAME == "build_resnet_fpn_backbone" and m.RESNETS.OUT_FEATURES == ["res2", "res3", "res4", "res5"]
    assert m.RESNETS.RES5_DILATION == 1 and m.RESNETS.STEM_OUT_CHANNELS == 64
    assert m.RPN.HEAD_NAME == "StandardRPNHead" and m.ROI_HEADS.NAME in ("StandardROIHeads", "CascadeROIHeads")
    cascade = m.ROI_HEADS.NAME == "CascadeROIHeads"  # one box head and predictor per entry of its regression weights
    stages = [list(w) for w in m.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS] if cascade else []
    assert not cascade or (m.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG and len(stages) == len(m.ROI_BOX_CASCADE_HEAD.IOUS))
    assert (m.ROI_BOX_HEAD.NAME, m.ROI_MASK_HEAD.NAME) == ("FastRCNNConvFCHead", "MaskRCNNConvUpsampleHead")
    assert m.ROI_BOX_HEAD.POOLER_TYPE == m.ROI_MASK_HEAD.POOLER_TYPE == "ROIAlignV2"  # aligned
    assert m.FPN.FUSE_TYPE == "sum" and m.ANCHOR_GENERATOR.OFFSET == 0.0 and m.ANCHOR_GENERATOR.ANGLES == [[-90, 0, 90]]
    # MODEL.NORM: the ResNet's and FPN's; MODEL.HEAD_NORM: the heads' where another kind (the X-152 cascade's GN)
    body = {_NORMS[n] for n in (m.RESNETS.NORM, m.FPN.NORM) if n}
    heads = {_NORMS[n] for n in (m.ROI_BOX_HEAD.NORM, m.ROI_MASK_HEAD.NORM) if n}
    assert len(body) == 1 and len(heads) <= 1, (body, heads)
    norm = body.pop()
    head_norm = heads.pop() if heads else norm
    sizes = [s for level in m.ANCHOR_GENERATOR.SIZES for s in level]
    assert len(m.ANCHOR_GENERATOR.SIZES) == 5 and len(m.ANCHOR_GENERATOR.ASPECT_RATIOS) == 1
    assert all(d == -1 for d in m.RPN.CONV_DIMS)
    assert len(cfg.INPUT.MIN_SIZE_TEST if isinstance(cfg.INPUT.MIN_SIZE_TEST, list) else [0]) <= 1
    regnet = m.get("REGNET")  # a RegNet bottom-up body (_lazy_as_yacs), else the ResNet of MODEL.RESNETS
    body = {  # a RegNet's body is MODEL.REGNET's
        f"MODEL.REGNET.{k}": regnet[k] for k in ("DEPTH", "W_A", "W_0", "W_M", "GROUP_WIDTH", "SE_RATIO", "STEM_WIDTH")
    } if regnet else {
        "MODEL.REGNET.DEPTH": 0,
        "MODEL.RESNETS.DEPTH": m.RESNETS.DEPTH,
        "MODEL.RESNETS.NUM_GROUPS": m.RESNETS.NUM_GROUPS,
        "MODEL.RESNETS.WIDTH_PER_GROUP": m.RESNETS.WIDTH_PER_GROUP,
    }
    return {
        **body,
        "MODEL.CONVENTION": "detectron2",
        "MODEL.NORM": norm,
        "MODEL.HEAD_NORM": "" if head_norm == norm else head_norm,
        "MODEL.FROZEN_BN_EPS": 1e-5,
        "MODEL.GN_NUM_GROUPS": 32,
        "MODEL.GN_EPS": 1e-5,
        "MODEL.PIXEL_MEAN": list(m.PIXEL_MEAN),
        "MODEL.PIXEL_STD": list(m.PIXEL_STD),
        "INPUT.FORMAT": cfg.INPUT.FORMAT,
        "INPUT.MIN_SIZE_TEST": cfg.INPUT.MIN_SIZE_TEST,
        "INPUT.MAX_SIZE_TEST": cfg.INPUT.MAX_SIZE_TEST,
        "INPUT.SIZE_DIVISIBILITY": 32,  # the FPN backbone's size_divisibility
        "MODEL.RESNETS.STRIDE_IN_1X1": m.RESNETS.STRIDE_IN_1X1,
        "MODEL.RESNETS.DEFORM_ON_PER_STAGE": list(m.RESNETS.DEFORM_ON_PER_STAGE),
        "MODEL.RESNETS.DEFORM_MODULATED": m.RESNETS.DEFORM_MODULATED,
        "MODEL.RESNETS.DEFORM_NUM_GROUPS": m.RESNETS.DEFORM_NUM_GROUPS,
        "MODEL.RESNETS.CONTEXT_ON_PER_STAGE": [False] * 4,  # detectron2 has no GC blocks
        "MODEL.FPN.OUT_CHANNELS": m.FPN.OUT_CHANNELS,
        "MODEL.FPN.USE_NORM": bool(m.FPN.NORM),
        "MODEL.ANCHOR_GENERATOR.SIZES": sizes,
        "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": list(m.ANCHOR_GENERATOR.ASPECT_RATIOS[0]),
        "MODEL.RPN.CONV_DEPTH": len(m.RPN.CONV_DIMS),
        "MODEL.RPN.PRE_NMS_TOPK_TEST": m.RPN.PRE_NMS_TOPK_TEST,
        "MODEL.RPN.POST_NMS_TOPK_TEST": m.RPN.POST_NMS_TOPK_TEST,
        "MODEL.RPN.NMS_THRESH": m.RPN.NMS_THRESH,
        "MODEL.RPN.MIN_SIZE": 0.0,
        "MODEL.ROI_HEADS.NUM_CLASSES": m.ROI_HEADS.NUM_CLASSES,
        "MODEL.ROI_HEADS.SCORE_THRESH_TEST": m.ROI_HEADS.SCORE_THRESH_TEST,
        "MODEL.ROI_HEADS.NMS_THRESH_TEST": m.ROI_HEADS.NMS_THRESH_TEST,
        "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE": cfg.TEST.DETECTIONS_PER_IMAGE,
        "MODEL.ROI_BOX_HEAD.NUM_CONV": m.ROI_BOX_HEAD.NUM_CONV,
        "MODEL.ROI_BOX_HEAD.CONV_DIM": m.ROI_BOX_HEAD.CONV_DIM,
        "MODEL.ROI_BOX_HEAD.NUM_FC": m.ROI_BOX_HEAD.NUM_FC,
        "MODEL.ROI_BOX_HEAD.FC_DIM": m.ROI_BOX_HEAD.FC_DIM,
        "MODEL.ROI_BOX_HEAD.USE_NORM": bool(m.ROI_BOX_HEAD.NORM) and m.ROI_BOX_HEAD.NUM_CONV > 0,
        "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": m.ROI_BOX_HEAD.POOLER_RESOLUTION,
        "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": m.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO,
        "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": list(m.ROI_BOX_HEAD.BBOX_REG_WEIGHTS),
        "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG": m.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG,
        "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS": stages,
        "MODEL.ROI_MASK_HEAD.NUM_CONV": m.ROI_MASK_HEAD.NUM_CONV,
        "MODEL.ROI_MASK_HEAD.CONV_DIM": m.ROI_MASK_HEAD.CONV_DIM,
        "MODEL.ROI_MASK_HEAD.USE_NORM": bool(m.ROI_MASK_HEAD.NORM),
        "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": m.ROI_MASK_HEAD.POOLER_RESOLUTION,
        "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": m.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO,
        "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK": m.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK,
        "MODEL.ROI_MASK_HEAD.THRESHOLD": 0.5,  # detectron2's paste_masks_in_image threshold
        "MODEL.MASKIOU_ON": False,  # nor a mask IoU head
    }


def _body_widths(cfg) -> list[int]:
    """The output channels of the bottom-up body of detectron2's config ``cfg`` (res2..res5 / s1..s4): a RegNet's
    as _lazy_as_yacs read them off the built body, a ResNet's from RES2_OUT_CHANNELS."""
    regnet = cfg.MODEL.get("REGNET")
    return list(regnet.OUT_CHANNELS) if regnet else [cfg.MODEL.RESNETS.RES2_OUT_CHANNELS << i for i in range(4)]


def _regnet_as_yacs(c, bottom_up) -> None:
    """Describe the LazyCall of detectron2's ``RegNet`` ``bottom_up`` in yaml config ``MODEL`` ``c``: its arguments in a
    new ``REGNET`` node (with ``OUT_CHANNELS``, read off the body it builds), its norm as the ResNet's. It must be what
    MODEL.REGNET describes: SimpleStem, ResBottleneckBlock with bottleneck ratio 1 (the stride in its 3x3 conv), stride
    2 per stage, ReLU, its four stages out."""
    import inspect

    from detectron2.config import CfgNode, instantiate
    from detectron2.modeling.backbone import RegNet
    from detectron2.modeling.backbone.regnet import ResBottleneckBlock, SimpleStem

    def arg(name):
        return bottom_up.get(name, inspect.signature(RegNet).parameters[name].default)

    assert (arg("stem_class"), arg("block_class")) == (SimpleStem, ResBottleneckBlock)
    assert arg("stride") == 2 and arg("bottleneck_ratio") == 1.0 and arg("activation_class") is None
    assert list(arg("out_features")) == ["s1", "s2", "s3", "s4"]
    body = instantiate(bottom_up)
    c.REGNET = CfgNode({"DEPTH": arg("depth"), "W_A": arg("w_a"), "W_0": arg("w_0"), "W_M": arg("w_m"),
                        "GROUP_WIDTH": arg("group_width"), "SE_RATIO": arg("se_ratio"), "STEM_WIDTH": arg("stem_width"),
                        "OUT_CHANNELS": [body.output_shape()[f"s{i}"].channels for i in range(1, 5)]})
    c.RESNETS.NORM, c.RESNETS.STRIDE_IN_1X1 = arg("norm"), False  # ResBottleneckBlock strides its 3x3 conv


def _lazy_as_yacs(d2, lazy):
    """The yaml config (``get_cfg`` with detectron2's Base-RCNN-FPN.yaml) describing what the LazyConfig ``lazy``
    instantiates at test time; arguments a ``LazyCall`` leaves out are its class's defaults."""
    import inspect

    from detectron2.config import get_cfg, instantiate
    from detectron2.modeling.backbone import RegNet
    from detectron2.modeling.roi_heads import FastRCNNOutputLayers

    def default(cls, arg):
        return inspect.signature(cls).parameters[arg].default

    def norm_name(norm):  # a string, or a function making the norm layer (NaiveSyncBatchNorm in the heads)
        return norm if isinstance(norm, str) else {"NaiveSyncBatchNorm": "naiveSyncBN"}[type(norm(8)).__name__]

    cfg = get_cfg()
    cfg.merge_from_file(str(d2.root() / "configs" / "Base-RCNN-FPN.yaml"))
    m, c = lazy.model, cfg.MODEL
    c.MASK_ON = True
    c.PIXEL_MEAN, c.PIXEL_STD, cfg.INPUT.FORMAT = list(m.pixel_mean), list(m.pixel_std), m.input_format
    bottom_up = m.backbone.bottom_up
    if bottom_up._target_ is RegNet:
        _regnet_as_yacs(c, bottom_up)
    else:
        assert bottom_up.stem.norm == bottom_up.stages.norm and bottom_up.stages.get("num_groups", 1) == 1
        c.RESNETS.DEPTH, c.RESNETS.STRIDE_IN_1X1 = bottom_up.stages.depth, bottom_up.stages.stride_in_1x1
        c.RESNETS.NORM = bottom_up.stages.norm
    c.FPN.NORM, c.FPN.OUT_CHANNELS = m.backbone.norm, m.backbone.out_channels
    rpn = m.proposal_generator
    c.RPN.CONV_DIMS = list(rpn.head.get("conv_dims", [-1]))
    c.RPN.PRE_NMS_TOPK_TEST, c.RPN.POST_NMS_TOPK_TEST = rpn.pre_nms_topk[1], rpn.post_nms_topk[1]
    c.RPN.NMS_THRESH = rpn.nms_thresh
    heads, box, predictor = m.roi_heads, m.roi_heads.box_head, m.roi_heads.box_predictor
    c.ROI_HEADS.NUM_CLASSES = heads.num_classes
    c.ROI_HEADS.SCORE_THRESH_TEST = predictor.get("test_score_thresh",
                                                  default(FastRCNNOutputLayers, "test_score_thresh"))
    c.ROI_HEADS.NMS_THRESH_TEST = predictor.get("test_nms_thresh", default(FastRCNNOutputLayers, "test_nms_thresh"))
    cfg.TEST.DETECTIONS_PER_IMAGE = predictor.get("test_topk_per_image",
                                                  default(FastRCNNOutputLayers, "test_topk_per_image"))
    c.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = list(instantiate(predictor.box2box_transform).weights)
    c.ROI_BOX_HEAD.NAME, c.ROI_BOX_HEAD.NUM_CONV = "FastRCNNConvFCHead", len(box.conv_dims)
    c.ROI_BOX_HEAD.CONV_DIM = box.conv_dims[0] if box.conv_dims else c.ROI_BOX_HEAD.CONV_DIM
    c.ROI_BOX_HEAD.NUM_FC, c.ROI_BOX_HEAD.FC_DIM = len(box.fc_dims), box.fc_dims[0]
    c.ROI_BOX_HEAD.NORM = norm_name(box.get("conv_norm", ""))
    mask = heads.mask_head
    c.ROI_MASK_HEAD.NUM_CONV, c.ROI_MASK_HEAD.CONV_DIM = len(mask.conv_dims) - 1, mask.conv_dims[0]
    c.ROI_MASK_HEAD.NORM = norm_name(mask.get("conv_norm", ""))
    for pooler, part in ((heads.box_pooler, c.ROI_BOX_HEAD), (heads.mask_pooler, c.ROI_MASK_HEAD)):
        part.POOLER_RESOLUTION, part.POOLER_SAMPLING_RATIO = pooler.output_size, pooler.sampling_ratio
        part.POOLER_TYPE = pooler.pooler_type
    (resize,) = lazy.dataloader.test.mapper.augmentations
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = resize.short_edge_length, resize.max_size
    return cfg


def test_each_config_computes_what_its_zoo_config_computes(d2):
    """Every shipped detectron2 config (one per registry entry) against the zoo config detectron2 ships."""
    assert len(ZOO_CONFIGS) == len([n for n in config_names() if n.startswith("detectron2/")])
    for name, zoo in ZOO_CONFIGS.items():
        cfg = minidet.get_cfg(name)
        zoo_cfg = d2.zoo_config(zoo)
        d2_cfg = _lazy_as_yacs(d2, zoo_cfg) if zoo.endswith(".py") else zoo_cfg
        assert list(body_of(cfg).out_channels) == _body_widths(d2_cfg), name  # the FPN's inputs
        expected = _expected(d2_cfg)
        got = {k: cfg_value(cfg, k) for k in expected}
        got = {k: list(v) if isinstance(v, tuple) else v for k, v in got.items()}
        assert got == expected, (name, {k: (got[k], v) for k, v in expected.items() if got[k] != v})


# zoo config -> d2_weights arguments of its synthetic file, and the proposals per image where fewer than the config's
# (both sides alike: LVIS's 1230 classes at score threshold 0.0001 make a slow reference otherwise)
NORMED_HEADS = {"fpn_norm": True, "head_norm": True, "box_convs": 4}
CASES = {
    "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml": ({"depth": 50}, None),
    "COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x.yaml": ({"depth": 101, "groups": 32, "width": 8}, None),
    "new_baselines/mask_rcnn_R_50_FPN_100ep_LSJ.py": ({"depth": 50, "rpn_convs": 2, "counters": True, **NORMED_HEADS},
                                                      None),
    "Misc/mask_rcnn_R_50_FPN_3x_gn.yaml": ({"depth": 50, "norm": "gn", **NORMED_HEADS}, None),
    "COCO-PanopticSegmentation/panoptic_fpn_R_50_1x.yaml": ({"depth": 50}, None),
    "LVISv0.5-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml": ({"depth": 50, "num_classes": 1230}, 50),
    "Cityscapes/mask_rcnn_R_50_FPN.yaml": ({"depth": 50, "num_classes": 8}, None),
}


@pytest.mark.parametrize("zoo", list(CASES))
def test_detections_are_detectron2s_bit_for_bit(d2, zoo, tmp_path):
    layout, proposals = CASES[zoo]
    zoo_cfg = d2.zoo_config(zoo, 320, 512)
    opts = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512, "MODEL.ROI_ALIGN_IMPL", "torchvision"]
    if proposals:
        zoo_cfg.MODEL.RPN.POST_NMS_TOPK_TEST = proposals
        opts += ["MODEL.RPN.POST_NMS_TOPK_TEST", proposals]
    weights = d2_weights(seed=3, **layout)
    if zoo.startswith("COCO-PanopticSegmentation/"):  # the file holds the semantic head too: minidet sets it aside
        from detectron2.modeling import build_model

        semantic = {k: v.numpy() for k, v in build_model(zoo_cfg).state_dict().items() if k.startswith("sem_seg_head.")}
        assert semantic
        weights.update(semantic)
    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": weights, "__author__": "test"}, f)
    reference = d2.predictor(zoo_cfg, path)
    assert {k: tuple(v.shape) for k, v in weights.items()} == d2.state_shapes(reference), zoo  # its module tree
    name = next(n for n, z in ZOO_CONFIGS.items() if z == zoo)
    ours = minidet.Predictor(config(f"configs/{name}.yaml", *opts, weights=path))
    image = structured_image(230, 311, 0)
    ref, out = d2.detect(reference, image), ours(image)
    assert_bit_identical(out, ref, zoo)
