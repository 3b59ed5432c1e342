"""The bottom-up bodies: which kind a config asks for (``BODIES``, one row a kind) and their shapes, without torch:
per stage (res2..res5) its blocks, widths and groups, for ResNet (depth, groups, width per group) and RegNet (the
generator parameters of Radosavovic et al. 2020, as detectron2's ``RegNet`` and mmdetection's ``arch`` table give
them). ``resnet.ResNet`` builds either from a ``Body``; the config check and ``minidet.testing`` read the same shapes
without building a model.

A new kind of body is one module here with a ``build(cfg, body, norm)`` (what ``detector.build_model`` calls;
``body``: what the row's ``shape`` gave) returning a module that maps images to its stages' maps by name, with
``out_channels`` (stage name -> channels, in order: its neck's inputs) and ``body`` (its shapes: the checkpoint's
body is checked against them), and one row of ``BODIES``: the config keys that turn it on, its shapes, its neck (a
module of ``minidet.necks`` with a ``build(cfg, in_channels, norm)``; FPN's by default)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}  # blocks of res2..res5 per depth


def resnet_depth(res4_blocks: int) -> int | None:
    """The ResNet depth whose res4 has ``res4_blocks`` blocks (``RESNET_BLOCKS``: the one depth rule), else None."""
    return next((d for d, blocks in RESNET_BLOCKS.items() if blocks[2] == res4_blocks), None)


@dataclass(frozen=True)
class Stage:
    """One stage of residual bottleneck blocks: ``blocks`` of them, the first with stride 2 (but res2 of a ResNet,
    after its max-pool); ``width`` the 3x3 conv's channels (in ``groups`` groups), ``out`` the block's output;
    ``se``: the squeeze-and-excitation channels after the 3x3 conv of each block, by block (0: none)."""

    blocks: int
    width: int
    out: int
    groups: int
    se: tuple[int, ...] = ()


@dataclass(frozen=True)
class Body:
    """A ResNet-style body: its stem (a ``stem_kernel`` conv of stride 2 to ``stem_channels``, then, with
    ``stem_pool``, a 3x3/2 max-pool) and its four stages."""

    stem_channels: int
    stem_kernel: int
    stem_pool: bool
    stages: tuple[Stage, ...]

    @property
    def out_channels(self) -> tuple[int, ...]:
        return tuple(s.out for s in self.stages)


def resnet_body(depth: int, num_groups: int = 1, width_per_group: int = 64) -> Body:
    """ResNet-50/101/152 (ResNeXt with ``num_groups`` > 1): 7x7 stem of 64 and a max-pool, outputs 256 to 2048."""
    if depth not in RESNET_BLOCKS:
        raise ValueError(f"ResNet depth must be one of {sorted(RESNET_BLOCKS)}; got {depth}")
    width = num_groups * width_per_group
    stages = tuple(Stage(n, width << i, 256 << i, num_groups) for i, n in enumerate(RESNET_BLOCKS[depth]))
    return Body(64, 7, True, stages)


def regnet_body(depth: int, w_a: float, w_0: int, w_m: float, group_width: int, se_ratio: float = 0.0,
                stem_width: int = 32, q: int = 8) -> Body:
    """RegNetX (RegNetY with ``se_ratio`` > 0): block widths ``w_0 + i * w_a`` (i < ``depth``) quantized to powers of
    ``w_m`` times ``w_0`` and to multiples of ``q``, equal widths one stage; each width rounded to a multiple of its
    group width (bottleneck ratio 1); a 3x3 stem of ``stem_width`` without a max-pool. The SE channels of a block are
    ``round(se_ratio x its input channels)``. Exactly four stages (the bodies an FPN takes), else ValueError."""
    if not (w_a >= 0 and w_0 > 0 and w_m > 1 and w_0 % q == 0):
        raise ValueError(f"RegNet parameters out of range: w_a {w_a}, w_0 {w_0}, w_m {w_m} (w_0 a multiple of {q})")
    widths = []
    for i in range(depth):
        k = round(math.log((i * w_a + w_0) / w_0) / math.log(w_m))
        widths.append(int(round(w_0 * w_m**k / q)) * q)
    stage_widths = sorted(set(widths))
    if len(stage_widths) != 4:
        raise ValueError(f"these RegNet parameters give {len(stage_widths)} stages; an FPN body has 4")
    stages, w_in = [], stem_width
    for w in stage_widths:
        g = min(group_width, w)
        w = max(g, int(round(w / g) * g))
        n = widths.count(stage_widths[len(stages)])
        se = tuple(int(round(c * se_ratio)) for c in [w_in] + [w] * (n - 1)) if se_ratio else ()
        stages.append(Stage(n, w, w, w // g, se))
        w_in = w
    return Body(stem_width, 3, False, tuple(stages))


def regnet_of(rg) -> Body:
    """The ``Body`` of the config's ``MODEL.REGNET`` node ``rg`` (its DEPTH set); ValueError naming MODEL.REGNET where
    the parameters give no four-stage RegNet."""
    try:
        return regnet_body(rg.DEPTH, rg.W_A, rg.W_0, rg.W_M, rg.GROUP_WIDTH, rg.SE_RATIO, rg.STEM_WIDTH)
    except ValueError as e:
        raise ValueError(f"MODEL.REGNET: {e}") from None


@dataclass(frozen=True)
class BodyKind:
    """A kind of bottom-up body: ``name`` as its users know it; ``on``: whether a config's ``MODEL`` node asks for it
    (the keys that turn it on); ``shape``: its shapes from the ``MODEL`` node (ValueError, naming the key, where they
    give none); ``module``: the module of this package whose ``build(cfg, body, norm)`` builds it; ``neck``: the
    module of ``minidet.necks`` whose ``build(cfg, in_channels, norm)`` builds the pyramid over its stages."""

    name: str
    on: Callable[[Any], bool]
    shape: Callable[[Any], Any]
    module: str
    neck: str = "fpn"


# the first row whose ``on`` holds is the config's body; the last, the plain ResNet, takes any config
BODIES: tuple[BodyKind, ...] = (
    BodyKind("RegNet", lambda m: bool(m.REGNET.DEPTH), lambda m: regnet_of(m.REGNET), "resnet"),
    BodyKind("ResNet", lambda m: True,
             lambda m: resnet_body(m.RESNETS.DEPTH, m.RESNETS.NUM_GROUPS, m.RESNETS.WIDTH_PER_GROUP), "resnet"),
)


def body_kind(model_node) -> BodyKind:
    """The kind of body the config's ``MODEL`` node asks for (``BODIES``)."""
    return next(kind for kind in BODIES if kind.on(model_node))
