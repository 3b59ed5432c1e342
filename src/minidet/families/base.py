"""The parts of a weight family (``Family``, ``WeightsEntry``) and what several family modules share."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError

if TYPE_CHECKING:
    from ..conventions import Convention

# torch.hub's convention, which torchvision's and mmdetection's downloads follow: a file named ``...-<8 hex>.pth``
# carries the first 8 hex digits of its SHA-256
_DIGEST_IN_NAME = re.compile(r"-([0-9a-f]{8})\.pth$")
_DIGEST_HOSTS = ("download.pytorch.org", "download.openmmlab.com")


def digest_prefix(url: str) -> str | None:
    """The SHA-256 prefix in the file name of a ``url`` of a host that names its files so, else None."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in _DIGEST_HOSTS:
        return None
    m = _DIGEST_IN_NAME.search(parts.path.rpartition("/")[2])
    return m[1] if m else None


Renamer = Callable[[str], "str | None"]  # checkpoint key -> minidet name; None: dropped by design (reported)


@dataclass(frozen=True)
class WeightsEntry:
    """One downloadable checkpoint. ``config``: the config name it belongs to (``src/minidet/configs/<config>.yaml``);
    ``filename``: the cached file's name, the basename of that config's ``MODEL.WEIGHTS``; ``sha256``/``size``:
    as the source publishes them (None: not published); ``box_ap``/``mask_ap``: the published COCO AP."""

    name: str
    url: str
    filename: str
    config: str
    sha256: str | None = None
    size: int | None = None
    box_ap: float | None = None
    mask_ap: float | None = None
    source: str = ""

    @property
    def name_prefix(self) -> str | None:
        """The digest prefix in the file name (``-bf2d0c1e.pth``), else None."""
        return digest_prefix(self.url)


@dataclass(frozen=True)
class Family:
    """One weight family. ``name`` is its ``MODEL.CONVENTION`` value, its format name in load reports and the folder
    of its configs (``configs/<name>/``); ``title`` names its files in messages.

    - ``arithmetic()``: its ``Convention`` (imports the engine's torch modules; see :func:`convention`);
    - ``recognize(keys)``: the file's key layout (``""`` when the family has one layout) if the checkpoint keys are
      this family's, else None;
    - ``renamer(keys)``: the rename function for a file with these keys;
    - ``fixed``: key layout -> {config key: the value the weights need} (beyond ``MODEL.CONVENTION`` = ``name``);
    - ``check(model, tensors, path)``: raises ``CheckpointError`` naming the config key to change when the file
      describes another architecture than the model (run before renaming);
    - ``ignores_non_arrays``: entries that are not arrays are dropped by design (else the file is refused);
    - ``weights``: its published checkpoints;
    - ``background_last``: the background is the last class index (detectron2, mmdetection), else the first; the
      family's configs count ``MODEL.ROI_HEADS.NUM_CLASSES`` without it, else with it;
    - ``mask_area``: how its evaluation sizes a mask result for APs/APm/APl (``minidet.apps.scoring``): ``mask``
      (its mask's area: the mask results have no box) or ``box`` (its mask results carry their boxes, whose area
      pycocotools then takes);
    - ``class_names(meta)``: the class names a file carries beside its weights (its wrapper's other entries), or
      None; ValueError (one line naming the entry) when they are no list of distinct, non-empty names; None where
      the family's files carry none."""

    name: str
    title: str  # for messages: "detectron2", "maskrcnn-benchmark", ...
    arithmetic: Callable[[], Convention]
    recognize: Callable[[Collection[str]], str | None]
    renamer: Callable[[Collection[str]], Renamer]
    fixed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    check: Callable[[Any, dict, str], None] | None = None
    ignores_non_arrays: bool = False
    weights: tuple[WeightsEntry, ...] = ()
    background_last: bool = False
    mask_area: str = "mask"
    class_names: Callable[[dict], list[str] | None] | None = None

    def config_values(self, layout: str) -> dict[str, Any]:
        """{config key: value} the weights of ``layout`` need, ``MODEL.CONVENTION`` first."""
        return {"MODEL.CONVENTION": self.name, **self.fixed.get(layout, {})}


def rename_by_rules(rules: list[tuple[str, str | Callable]], name: str) -> str:
    """``name`` with what the first matching rule's pattern matches replaced (a template or a function of the
    match); unchanged when no rule matches (the matcher reports it)."""
    for pattern, rep in rules:
        if m := re.match(pattern, name):
            return (rep(m) if callable(rep) else m.expand(rep)) + name[m.end() :]
    return name


def _stages(weights: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The body's stage widths (each stage's first block's output channels) and blocks, from minidet's names."""
    widths, blocks = [], []
    for i in range(2, 6):
        first = weights.get(f"backbone.res{i}.0.conv3.weight")
        widths.append(int(first.shape[0]) if first is not None else 0)
        found = [int(m[1]) for k in weights if (m := re.match(rf"backbone\.res{i}\.(\d+)\.", k))]
        blocks.append(1 + max(found, default=-1))
    return tuple(widths), tuple(blocks)


def check_body(model, weights: Mapping[str, Any], path: str, family: str) -> bool:
    """Fail in one line when the checkpoint's body (``weights`` under minidet's names) is a RegNet and the model's a
    ResNet (its stem a 3x3 conv, not a 7x7) or the other way round, or a RegNet of other stage widths or blocks than
    the model's (``MODEL.REGNET``), naming the config that runs it (a ResNet: the family's plain one); returns whether
    the body is a RegNet."""
    from .architectures import PLAIN, REGNET  # noqa: PLC0415 (the table imports this module)

    stem, own = weights.get("backbone.stem.conv1.weight"), getattr(getattr(model, "backbone", None), "stem", None)
    if own is None:  # not a minidet body
        return False
    conv, model_regnet = own.conv1, not own.pool
    if stem is None or len(getattr(stem, "shape", ())) != 4:
        return model_regnet
    file_regnet = stem.shape[-1] == 3
    config = REGNET.config.get(family)
    if file_regnet != model_regnet:
        if file_regnet:
            runs = f"such as {config}" if config else "(none of this family's is shipped)"
            raise CheckpointError(
                f"{path}: the checkpoint's body is a RegNet (its stem a 3x3 conv of {stem.shape[0]} channels) but the "
                f"config builds a ResNet (a {conv.kernel_size[0]}x{conv.kernel_size[1]} stem): minidet runs it with "
                f"a config that sets MODEL.REGNET, {runs}")
        raise CheckpointError(
            f"{path}: the checkpoint's body is a ResNet (its stem a {stem.shape[-2]}x{stem.shape[-1]} conv) but the "
            f"config builds a RegNet: minidet runs it with a ResNet config (MODEL.REGNET.DEPTH 0), such as "
            f"{PLAIN[family]}")
    if model_regnet:
        have = _stages(weights)
        want = tuple(model.backbone.out_channels.values()), tuple(len(getattr(model.backbone, n))
                                                                  for n in model.backbone.out_channels)
        if have != want:
            raise CheckpointError(
                f"{path}: the checkpoint's RegNet has stages of {', '.join(map(str, have[0]))} channels with "
                f"{', '.join(map(str, have[1]))} blocks but the config's (MODEL.REGNET) has "
                f"{', '.join(map(str, want[0]))} with {', '.join(map(str, want[1]))}: the file's own config sets "
                "MODEL.REGNET for it (`minidet configs` lists the shipped ones)")
    return model_regnet


def check_depth(model, names: Collection[str], pattern: str, path: str) -> None:
    """Fail naming MODEL.RESNETS.DEPTH when the checkpoint's res4 (the ``pattern``'s block index) has another number
    of blocks than the model's."""
    blocks = 1 + max((int(m[1]) for k in names if (m := re.match(pattern, k))), default=-1)
    if blocks and blocks != len(model.backbone.res4):
        depth = {6: 50, 23: 101, 36: 152}.get(blocks, "?")
        raise CheckpointError(
            f"{path}: ResNet-{depth} (res4 has {blocks} blocks) but the model has {len(model.backbone.res4)}; "
            f"set MODEL.RESNETS.DEPTH {depth}"
        )


def check_groups(model, weight, key: str, path: str) -> None:
    """Fail naming MODEL.RESNETS.NUM_GROUPS and WIDTH_PER_GROUP when the checkpoint's first 3x3 conv of res2
    (``weight`` under the file's name ``key``: (out, in / groups, 3, 3), None where the file has none) is grouped
    otherwise than the model's (a ResNeXt file and a ResNet config, or ResNeXts of other widths)."""
    shape, conv = tuple(getattr(weight, "shape", ())), model.backbone.res2[0].conv2
    if len(shape) == 4 and shape[1] and (shape[0] // shape[1], shape[0]) != (conv.groups, conv.out_channels):
        groups = shape[0] // shape[1]
        raise CheckpointError(
            f"{path}: {key} is a 3x3 conv of {groups} groups of {shape[1]} channels but the model's has {conv.groups} "
            f"of {conv.out_channels // conv.groups}; set MODEL.RESNETS.NUM_GROUPS {groups} and WIDTH_PER_GROUP "
            f"{shape[1]}"
        )


# output layer names shared by torchvision, maskrcnn-benchmark and Detectron
RPN_OUT = {"cls_logits": "objectness_logits", "bbox_pred": "anchor_deltas"}
MASK_OUT = {"conv5_mask": "deconv", "mask_fcn_logits": "predictor"}
