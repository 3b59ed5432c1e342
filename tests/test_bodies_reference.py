"""``minidet.bodies`` against its sources (the ``reference`` extra): every RegNet the zoos use has the stage widths,
blocks and groups that mmdetection 3.3.0's ``RegNet`` and detectron2's ``RegNet`` compute from the same generator
parameters, and the ResNet shapes are the ResNet's. Shapes only; the detections are
tests/test_regnet_gc_ms_reference.py's."""

import pytest

from helpers import needs_extra
from minidet.bodies import regnet_body, resnet_body

pytestmark = [needs_extra("mmdet", "reference"), needs_extra("fvcore", "reference")]


@pytest.fixture(scope="module")
def mm_regnet():
    from mmdet_reference import install_stand_ins

    install_stand_ins()
    from mmdet.models.backbones import RegNet

    return RegNet


def _mm_shapes(regnet) -> list[tuple[int, int, int, int]]:
    """(blocks, 3x3 width, output channels, groups) per stage of an mmdetection RegNet module."""
    out = []
    for name in regnet.res_layers:
        layer = getattr(regnet, name)
        conv2 = layer[0].conv2
        out.append((len(layer), conv2.out_channels, layer[0].conv3.out_channels, conv2.groups))
    return out


def test_mmdetection_regnets_have_the_sources_stages(mm_regnet):
    for arch, params in mm_regnet.arch_settings.items():
        ref = mm_regnet(arch)
        body = regnet_body(params["depth"], params["wa"], params["w0"], params["wm"], params["group_w"])
        assert _mm_shapes(ref) == [(s.blocks, s.width, s.out, s.groups) for s in body.stages], arch
        assert ref.conv1.out_channels == body.stem_channels and ref.conv1.kernel_size == (body.stem_kernel,) * 2


@pytest.mark.parametrize("params", [  # detectron2's RegNetX-4GF and RegNetY-4GF (configs/new_baselines)
    {"depth": 23, "w_a": 38.65, "w_0": 96, "w_m": 2.43, "group_width": 40},
    {"depth": 22, "w_a": 31.41, "w_0": 96, "w_m": 2.24, "group_width": 64, "se_ratio": 0.25},
])
def test_detectron2_regnets_have_the_sources_stages(params):
    from detectron2_reference import root

    root()
    from detectron2.modeling.backbone.regnet import RegNet, ResBottleneckBlock, SimpleStem

    ref = RegNet(stem_class=SimpleStem, stem_width=32, block_class=ResBottleneckBlock, norm="BN",
                 out_features=["s1", "s2", "s3", "s4"], **params)
    body = regnet_body(params["depth"], params["w_a"], params["w_0"], params["w_m"], params["group_width"],
                       params.get("se_ratio", 0.0), stem_width=32)
    for (stage, _), ours in zip(ref.stages_and_names, body.stages):
        blocks = list(stage.children())
        se = [b.f.se.f_ex[0].out_channels if b.f.se is not None else 0 for b in blocks]
        got = (len(blocks), blocks[0].f.b.out_channels, blocks[0].f.c.out_channels, blocks[0].f.b.groups)
        assert got == (ours.blocks, ours.width, ours.out, ours.groups)
        assert se == (list(ours.se) if ours.se else [0] * ours.blocks)


def test_resnet_bodies_are_the_resnets():
    import torchvision

    for depth, make in ((50, torchvision.models.resnet50), (101, torchvision.models.resnet101)):
        ref, body = make(), resnet_body(depth)
        for i, stage in enumerate(body.stages):
            layer = getattr(ref, f"layer{i + 1}")
            assert (len(layer), layer[0].conv2.out_channels, layer[0].conv3.out_channels) == (
                stage.blocks, stage.width, stage.out)
