"""The parts of a weight family (``Family``, ``WeightsEntry``) and what several family modules share."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..bodies import Body, resnet_depth
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


NOT_STATED = "not stated"  # a zoo that says nothing of its weights' licence (the licence of its code is another matter)


@dataclass(frozen=True)
class Family:
    """One weight family. ``name`` is its ``MODEL.CONVENTION`` value, its format name in load reports and the folder
    of its configs (``configs/<name>/``); ``title`` is its zoo's own name, for messages (with ``models``, the models
    of the zoo minidet reads where it reads not all of them, it names the family's files); ``licence``: the licence
    its zoo states for its published weights (``NOT_STATED`` where it says nothing of it), ``licence_source``: the
    file and repository that say so (or say nothing), ``<file> of <repository>``; weights/README.md says what each
    zoo says, in our words.

    - ``arithmetic()``: its ``Convention`` (imports the engine's torch modules; see :func:`convention`);
    - ``recognize(keys)``: the file's key layout (``""`` when the family has one layout) if the checkpoint keys are
      this family's, else None;
    - ``renamer(keys)``: the rename function for a file with these keys;
    - ``fixed``: key layout -> {config key: the value the weights need} (beyond ``MODEL.CONVENTION`` = ``name``);
    - ``check(model, tensors, path)``: raises ``CheckpointError`` naming the config key to change when the file
      (``tensors`` under its own key names) describes another variant than the model, in the family's own words
      (what every family's files are checked for is ``checkpoint.load_checkpoint``'s: the body, the architecture,
      the format's config values);
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
    licence: str
    licence_source: str
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
    models: str = ""

    @property
    def files(self) -> str:
        """What its files are, for messages: ``torchvision maskrcnn_resnet50_fpn[_v2]``, ``detectron2``."""
        return f"{self.title} {self.models}" if self.models else self.title

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


def check_body(weights: Mapping[str, Any], keys: Mapping[str, str], body: Body | None, path: str, family: str) -> None:
    """Fail in one line, naming the config key to change, when the checkpoint's body (``weights``: its renamed view,
    minidet name -> tensor; ``keys``: minidet name -> the file's key, for messages) is not the config's ``body``
    (its shapes, ``bodies.Body``; None: not a minidet body, nothing to check): a RegNet under a ResNet config (its
    stem a 3x3 conv, not a 7x7) or the other way round (naming the config that runs it: a ResNet, the family's plain
    one); a RegNet of other stage widths or blocks (``MODEL.REGNET``); a ResNet of another depth (res4's blocks,
    ``MODEL.RESNETS.DEPTH``); a first 3x3 conv of res2 grouped otherwise (a ResNeXt file and a ResNet config, or
    ResNeXts of other widths: ``MODEL.RESNETS.NUM_GROUPS`` and ``WIDTH_PER_GROUP``). No model is built."""
    from .architectures import PLAIN, REGNET  # noqa: PLC0415 (the table imports this module)

    if body is None:
        return
    stem, body_regnet = weights.get("backbone.stem.conv1.weight"), not body.stem_pool
    if stem is not None and len(getattr(stem, "shape", ())) == 4 and (stem.shape[-1] == 3) != body_regnet:
        if not body_regnet:
            config = REGNET.config.get(family)
            runs = f"such as {config}" if config else "(none of this family's is shipped)"
            raise CheckpointError(
                f"{path}: the checkpoint's body is a RegNet (its stem a 3x3 conv of {stem.shape[0]} channels) but the "
                f"config builds a ResNet (a {body.stem_kernel}x{body.stem_kernel} stem): minidet runs it with a config "
                f"that sets MODEL.REGNET, {runs}")
        raise CheckpointError(
            f"{path}: the checkpoint's body is a ResNet (its stem a {stem.shape[-2]}x{stem.shape[-1]} conv) but the "
            f"config builds a RegNet: minidet runs it with a ResNet config (MODEL.REGNET.DEPTH 0), such as "
            f"{PLAIN[family]}")
    if body_regnet:
        have, want = _stages(weights), (body.out_channels, tuple(s.blocks for s in body.stages))
        if stem is not None and len(getattr(stem, "shape", ())) == 4 and have != want:
            raise CheckpointError(
                f"{path}: the checkpoint's RegNet has stages of {', '.join(map(str, have[0]))} channels with "
                f"{', '.join(map(str, have[1]))} blocks but the config's (MODEL.REGNET) has "
                f"{', '.join(map(str, want[0]))} with {', '.join(map(str, want[1]))}: the file's own config sets "
                "MODEL.REGNET for it (`minidet configs` lists the shipped ones)")
        return
    blocks = 1 + max((int(m[1]) for k in weights if (m := re.match(r"backbone\.res4\.(\d+)\.", k))), default=-1)
    if blocks and blocks != (own := body.stages[2].blocks):
        depth = resnet_depth(blocks) or "?"
        raise CheckpointError(f"{path}: ResNet-{depth} (res4 has {blocks} blocks) but the model has {own}; "
                              f"set MODEL.RESNETS.DEPTH {depth}")
    first, res2 = "backbone.res2.0.conv2.weight", body.stages[0]  # a ResNeXt's groups and width: (out, in / groups)
    shape = tuple(getattr(weights.get(first), "shape", ()))
    if len(shape) == 4 and shape[1] and (shape[0] // shape[1], shape[0]) != (res2.groups, res2.width):
        groups = shape[0] // shape[1]
        raise CheckpointError(
            f"{path}: {keys.get(first, first)} is a 3x3 conv of {groups} groups of {shape[1]} channels but the model's "
            f"has {res2.groups} of {res2.width // res2.groups}; set MODEL.RESNETS.NUM_GROUPS {groups} and "
            f"WIDTH_PER_GROUP {shape[1]}"
        )


# output layer names shared by torchvision, maskrcnn-benchmark and Detectron
RPN_OUT = {"cls_logits": "objectness_logits", "bbox_pred": "anchor_deltas"}
MASK_OUT = {"conv5_mask": "deconv", "mask_fcn_logits": "predictor"}
