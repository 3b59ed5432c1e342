"""What minidet knows of each architecture, in one table (``ARCHITECTURES``), and what a checkpoint may hold beside
the Mask R-CNN that minidet builds (``SET_ASIDE``). Key names are given as each family spells them (family name -> a
pattern that ``re.match``es the file's key names). Importing this needs no torch.

- ``ARCHITECTURES``: the plain Mask R-CNN (``MASK_RCNN``) and each architecture beyond it, one :class:`Architecture`
  each: the config keys that turn it on (``switches``) and those it adds (``settings``, with their defaults and
  rules: ``config._DEFAULTS`` takes them) and the checks across them (``rules``: ``config.validate_cfg`` runs them),
  its key patterns per family, the shipped config per family that runs it, the runtimes that cannot run its graph
  (``lacks``: ``onnxfile.UNSUPPORTED``), its int8 policy (``int8``: ``quantize.QUANTIZED``, ``KEPT_FLOAT``,
  ``KEPT_FLOAT_BLOCKS``), its ``minidet bench`` variants (``bench``: shipped configs whose own keys it sets), its name
  in ``minidet weights list --arch`` (``tag``). ``RUNS``: those minidet runs (a shipped config runs them);
  ``NOT_YET``: those it does not run yet, which docs/zoo.md's "needs" names (``tools/zoo_table.py`` makes docs/zoo.md
  and the README's support matrix from this table).
- A file with keys of an architecture that the model takes none of is refused in one line naming the architecture,
  an example key, the count and the config that runs it (:func:`refuse_other_architecture`). To run one: build its
  layers, map its keys in the family's rename rules (then the model takes them and nothing here fires), put the
  config's name in ``config`` under the family, which the message then offers to those who load such a file with
  another config, and the config keys that turn it on in ``switches``: then a file and a config that disagree about
  it are one line in either direction before anything is built (:func:`refuse_config_mismatch`: the file has its
  keys and the config leaves it off, or the config turns it on and the file has none of them).
- ``SET_ASIDE``: keys known to play no part at inference (training state, copies of the weights, heads no
  detection reads). The families' renamers drop them (:func:`set_aside`) and the load report names each with its
  reason.

Every other key that no layer of the model takes is refused (``checkpoint.load_checkpoint``): minidet runs a file
only as a whole, so that its detections are the source's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from ..bodies import regnet_of
from ..errors import CheckpointError, shown

_ANY = "*"  # a SetAside key for every family

Rule = Callable[[Any], "str | None"]  # a check across config keys: the config -> its problem in one line, or None


@dataclass(frozen=True)
class Int8:
    """What ``minidet export --precision int8`` does with an architecture's modules (``export/quantize.py`` reads
    the table): ``quantized``: the module paths whose weighted layers compute in int8; ``kept_float``: module path
    (inside a quantized one) -> why it stays float32; ``kept_blocks``: a block's name -> why it stays float32
    wherever it is (a module path with this name in it). Every module outside ``quantized`` stays float32 too."""

    quantized: tuple[str, ...] = ()
    kept_float: Mapping[str, str] = field(default_factory=dict)
    kept_blocks: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchVariant:
    """A ``minidet bench --norms`` variant of an architecture: its ``name``; ``configs``: shipped configs (a Base
    yaml, or a leaf for a body's parameters) whose own keys (those the file sets itself, not its ``_BASE_``'s;
    ``MODEL.WEIGHTS`` aside) the bench sets over its config, in order; ``then``: ``KEY VALUE`` pairs after them."""

    name: str
    configs: tuple[str, ...]
    then: tuple = ()


@dataclass(frozen=True)
class Architecture:
    """The plain Mask R-CNN or an architecture beyond it. ``name``: as its users know it; ``keys``: family name ->
    pattern of the key names only its files have; ``config``: family name -> the shipped config that runs it (none:
    minidet does not run it yet); ``includes``: the names of the entries whose keys its files hold too (a Hybrid Task
    Cascade is a cascade), not named apart; ``switches``: the config keys that turn it on, any of them away from
    minidet's default; ``settings``: the config keys it adds, key -> (default, rule) as ``config._DEFAULTS`` has
    them; ``rules``: its checks across config keys; ``lacks``: runtime (``runtimes.RUNTIMES``) -> (the ONNX operator
    of its graph that runtime has no kernel or conversion for, what it is); ``int8``: its int8 policy; ``bench``: its
    ``minidet bench`` variants; ``tag``: its name in ``minidet weights list --arch`` ('': not listed apart)."""

    name: str
    keys: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, str] = field(default_factory=dict)
    includes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    settings: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    lacks: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    int8: Int8 = Int8()
    bench: tuple[BenchVariant, ...] = ()
    tag: str = ""

    @property
    def runs(self) -> bool:
        """Whether minidet runs it: a shipped config does."""
        return bool(self.config)


@dataclass(frozen=True)
class SetAside:
    """Keys that play no part at inference: ``what`` they are (why they may go), family name (``*``: any) ->
    pattern."""

    what: str
    keys: Mapping[str, str]


_BLOCK = {  # a ResNet bottleneck block in each family's files
    "mmdetection": r"backbone\.layer\d\.\d+\.",
    "detectron2": r"backbone\.bottom_up\.res\d\.\d+\.",
    "maskrcnn_benchmark": r"backbone\.body\.layer\d\.\d+\.",
}


def _four_flags(key: str) -> Rule:
    """The rule that ``MODEL.RESNETS.<key>`` is one boolean per stage."""
    def rule(cfg) -> str | None:
        flags = cfg.MODEL.RESNETS[key]
        if not isinstance(flags, (list, tuple)) or len(flags) != 4 or not all(isinstance(d, bool) for d in flags):
            return f"MODEL.RESNETS.{key} must be 4 booleans (res2 to res5); got {shown(flags)}"
        return None
    return rule


def _regnet_parameters(cfg) -> str | None:
    if cfg.MODEL.REGNET.DEPTH:
        try:
            regnet_of(cfg.MODEL.REGNET)
        except ValueError as e:
            return str(e)
    return None


def _positive_fours(stages) -> bool:
    """Whether ``stages`` is a list of lists of 4 finite numbers > 0 (booleans are no numbers)."""
    return isinstance(stages, (list, tuple)) and all(
        isinstance(w, (list, tuple)) and len(w) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in w)
        for w in stages)


def _cascade_stages(cfg) -> str | None:
    m = cfg.MODEL
    stages = m.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS
    if not _positive_fours(stages):
        return ("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS must be a list of 4 numbers > 0 per cascade "
                f"stage, or empty; got {shown(stages)}")
    if len(stages) == 1:
        return ("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS: a cascade has 2 or more stages (empty: none, "
                f"MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS applies); got {shown(stages)}")
    if stages and not m.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG:
        return ("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS needs MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG "
                "True: the cascade's stages regress class-agnostic boxes")
    return None


MASK_RCNN = Architecture(
    "Mask R-CNN (ResNet or ResNeXt body, FPN, RPN, box and mask heads)",
    config={  # family name -> the shipped config of its plain R-50 Mask R-CNN
        "torchvision": "torchvision/maskrcnn_resnet50_fpn",
        "detectron": "detectron/e2e_mask_rcnn_R-50-FPN_1x",
        "detectron2": "detectron2/mask_rcnn_R_50_FPN_3x",
        "maskrcnn_benchmark": "maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x",
        "mmdetection": "mmdetection/mask-rcnn_r50_fpn_1x_coco",
    },
    int8=Int8(quantized=("backbone", "fpn", "box_head"), kept_float={
        "backbone.stem": "the first convolution: it sees the normalized image itself, and its three input channels "
                         "make it a tiny share of the work",
        "rpn.head": "the RPN head: its objectness ranks every anchor; quantized together with the FPN it lost the "
                    "proposals (all at the image's corner) on the test weights under OpenVINO 2026.4",
        "box_predictor": "the class scores and box deltas: the detections' scores and boxes themselves, a tiny share",
        "mask_head": "the mask head: int8 coarsens the 28x28 mask logits, the masks' outlines (OpenVINO's own Mask "
                     "R-CNN tutorial shows some masks 'considerably less accurate' in int8)",
    }),
)
PLAIN: Mapping[str, str] = MASK_RCNN.config  # family name -> the shipped config of its plain R-50 Mask R-CNN

DCN = Architecture(
    "deformable convolution (DCN)", {
        "mmdetection": _BLOCK["mmdetection"] + r"conv2(?:\.conv_offset|_offset)\.",  # mmcv's *Pack; 1.x's name
        "detectron2": _BLOCK["detectron2"] + r"conv2_offset\.",  # DeformBottleneckBlock
        "maskrcnn_benchmark": _BLOCK["maskrcnn_benchmark"] + r"conv2\.(?:offset|conv)\.",  # DFConv2d
    }, config={"mmdetection": "mmdetection/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco",
               "detectron2": "detectron2/mask_rcnn_R_50_FPN_1x_dconv_c3-c5"},
    switches=("MODEL.RESNETS.DEFORM_ON_PER_STAGE",),
    settings={
        # deformable 3x3 convs in the blocks of res2..res5 where True (four booleans); v2 (modulated) or v1; their
        # groups
        "MODEL.RESNETS.DEFORM_ON_PER_STAGE": ([False, False, False, False], None),
        "MODEL.RESNETS.DEFORM_MODULATED": (False, None),
        "MODEL.RESNETS.DEFORM_NUM_GROUPS": (1, "[1, 64]"),
    },
    rules=(_four_flags("DEFORM_ON_PER_STAGE"),),
    lacks={"openvino": ("DeformConv", "deformable convolution")},  # OpenVINO has no conversion of ONNX's DeformConv
    bench=(BenchVariant("dcn", ("detectron2/Base-detectron2-dconv",)),
           BenchVariant("dcnv2", ("detectron2/Base-detectron2-dconv",), ("MODEL.RESNETS.DEFORM_MODULATED", True))),
    tag="dcn",
)
GC_BLOCKS = Architecture(
    "global context blocks (GCNet)", {"mmdetection": _BLOCK["mmdetection"] + r"context_block\w*\."},
    config={"mmdetection": "mmdetection/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco"},
    switches=("MODEL.RESNETS.CONTEXT_ON_PER_STAGE",),
    settings={
        # GC blocks (mmcv's ContextBlock) ending the blocks of res2..res5 where True (four booleans), of this ratio
        "MODEL.RESNETS.CONTEXT_ON_PER_STAGE": ([False, False, False, False], None),
        "MODEL.RESNETS.CONTEXT_RATIO": (1 / 16, "(0, 1]"),
    },
    rules=(_four_flags("CONTEXT_ON_PER_STAGE"),),
    int8=Int8(kept_blocks={
        "context": "GC blocks (GCNet's ContextBlock): their attention pooling weights every position of a map by a "
                   "softmax of about 1 / positions each, which int8 activations round to a few levels; a tiny share "
                   "of the work",
    }),
    bench=(BenchVariant("gcb", ("mmdetection/Base-mmdetection-gcb",)),),  # r16: MODEL.RESNETS.CONTEXT_RATIO's default
    tag="gcb",
)
_LSJ = "detectron2's LSJ new baseline (two RPN convs)"
REGNET = Architecture(
    "RegNet backbone", {"detectron2": r"backbone\.bottom_up\.(?:stem\.(?:conv|bn)|s\d+\.b\d+)\."},
    # mmdetection's RegNet has its ResNet's key names: families.check_body tells them by the stem
    config={"detectron2": "detectron2/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ",
            "mmdetection": "mmdetection/mask-rcnn_regnetx-3.2GF_fpn_1x_coco"},
    includes=(_LSJ,), switches=("MODEL.REGNET.DEPTH",),  # detectron2's RegNet files are LSJ ones
    settings={
        # a RegNet body in place of the ResNet (MODEL.RESNETS.DEPTH, NUM_GROUPS, WIDTH_PER_GROUP unused; the other
        # RESNETS keys apply): its total blocks (0: a ResNet), the generator's slope, initial width and width
        # multiplier, the group width, RegNetY's SE ratio (0: RegNetX) and the stem's width, as detectron2's and
        # mmdetection's RegNet
        "MODEL.REGNET.DEPTH": (0, "[0, 100]"),
        "MODEL.REGNET.W_A": (0.0, "[0, 1000]"),
        "MODEL.REGNET.W_0": (8, "[8, 1024]"),
        "MODEL.REGNET.W_M": (2.0, "(1, 100]"),
        "MODEL.REGNET.GROUP_WIDTH": (8, "[1, 1024]"),
        "MODEL.REGNET.SE_RATIO": (0.0, "[0, 1]"),
        "MODEL.REGNET.STEM_WIDTH": (32, "[1, 1024]"),
    },
    rules=(_regnet_parameters,),
    # issue 45: RegNets of about R-50's cost (mmdetection's regnetx-3.2GF and -4GF, detectron2's RegNetY-4GF), the
    # stride in their 3x3 convs as in detectron2's and mmdetection's RegNet, over the bench config's pixel statistics
    bench=tuple(BenchVariant(name, (config,), ("MODEL.RESNETS.STRIDE_IN_1X1", False))
                for name, config in (("regnetx-3.2gf", "mmdetection/mask-rcnn_regnetx-3.2GF_fpn_1x_coco"),
                                     ("regnetx-4gf", "mmdetection/mask-rcnn_regnetx-4GF_fpn_1x_coco"),
                                     ("regnety-4gf", "detectron2/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ"))),
    tag="regnet",
)
# detectron2's new baselines: of its model zoo only they have an RPN head of two convs (and with it SyncBN in the FPN
# and heads, the 4conv1fc box head): its keys tell them from the plain model and the SyncBN ones
LSJ = Architecture(_LSJ, {"detectron2": r"proposal_generator\.rpn_head\.conv\.conv\d\."},
                   config={"detectron2": "detectron2/mask_rcnn_R_50_FPN_100ep_LSJ"}, switches=("MODEL.RPN.CONV_DEPTH",))
CASCADE = Architecture(
    "Cascade R-CNN", {
        "mmdetection": r"roi_head\.(?:bbox|mask)_head\.\d+\.",
        "detectron2": r"roi_heads\.box_(?:head|predictor)\.\d+\.",
        "detectron": r".+_(?:2nd|3rd)_[wb]$",  # Detectron-Cascade-RCNN's second and third stages
    }, config={"mmdetection": "mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco",
               "detectron2": "detectron2/cascade_mask_rcnn_R_50_FPN_1x"},
    switches=("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS",),
    settings={
        # Cascade R-CNN: one box stage per entry, each its box regression weights (4 numbers > 0, as
        # BBOX_REG_WEIGHTS, which it replaces); empty: one stage, plain Mask R-CNN. Class-agnostic box regression only
        "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS": ([], None),
    },
    rules=(_cascade_stages,),
    int8=Int8(quantized=("cascade.heads",)),
    bench=(BenchVariant("cascade", ("detectron2/Base-detectron2-cascade",)),
           BenchVariant("cascade+dcn", ("detectron2/Base-detectron2-cascade", "detectron2/Base-detectron2-dconv"))),
    tag="cascade",
)
MASK_SCORING = Architecture(
    "Mask Scoring R-CNN (mask IoU head)", {
        "mmdetection": r"roi_head\.mask_iou_head\.",
        "maskrcnn_benchmark": r"roi_heads\.maskiou\.",
    }, config={"mmdetection": "mmdetection/ms-rcnn_r50-caffe_fpn_1x_coco"}, switches=("MODEL.MASKIOU_ON",),
    settings={
        # Mask Scoring R-CNN: score = box score x the mask IoU head's IoU (with MASK_ON; MASK_ON False: the box scores)
        "MODEL.MASKIOU_ON": (False, None),
    },
    int8=Int8(kept_float={
        "mask_iou_head": "Mask Scoring R-CNN's mask IoU head: it reads the mask head's masks, and the IoU it predicts "
                         "multiplies each detection's score",
    }),
    bench=(BenchVariant("maskiou", ("mmdetection/Base-mmdetection-ms-rcnn",)),),
    tag="ms-rcnn",
)
# mmdetection's PanopticFPN: its instances are those of its instance branch under that branch's own test settings
# (one class-agnostic NMS, MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC, score 0.6), not the plain Mask R-CNN's; its semantic
# head is set aside (SET_ASIDE). detectron2's PanopticFPN tests its instances as the plain model does (and its configs
# are the plain ones): its semantic head is only set aside
PANOPTIC = Architecture("Panoptic FPN (semantic head)", {"mmdetection": r"semantic_head\."},
                        config={"mmdetection": "mmdetection/panoptic-fpn_r50_fpn_1x_coco"},
                        switches=("MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC",))

ARCHITECTURES: tuple[Architecture, ...] = (
    MASK_RCNN,
    DCN,
    GC_BLOCKS,
    Architecture("generalized attention blocks (empirical attention)",
                 {"mmdetection": _BLOCK["mmdetection"] + r"gen_attention_block\w*\."}),
    Architecture("non-local blocks", {"mmdetection": _BLOCK["mmdetection"] + r"nonlocal_block\w*\."}),
    REGNET,
    LSJ,
    Architecture("Hybrid Task Cascade (HTC)",
                 {"mmdetection": r"roi_head\.(?:semantic_head|mask_head\.\d+\.conv_res)\."},
                 includes=("Cascade R-CNN",)),
    CASCADE,
    MASK_SCORING,
    PANOPTIC,
    Architecture("Keypoint R-CNN (keypoint head)", {
        "torchvision": r"roi_heads\.keypoint_(?:head|predictor)\.",
        "detectron2": r"roi_heads\.keypoint_head\.",
        "maskrcnn_benchmark": r"roi_heads\.keypoint\.",
        "detectron": r"(?:kps_\w+|conv_fcn\d+)_[wb]$",
    }),
    # what the zoos' other Mask R-CNN-family files need (docs/zoo_census.tsv names them; their keys: not yet listed)
    Architecture("HRNet backbone with HRFPN"),
    Architecture("Seesaw loss (its class logits)"),
    Architecture("C4 backbone (res5 box head)"),
    Architecture("DC5 backbone (dilated res5)"),
    Architecture("ResNeSt"),
    Architecture("Res2Net"),
    Architecture("ResNeXt-152"),
    Architecture("Swin"),
    Architecture("ConvNeXt"),
    Architecture("FBNet backbone"),
    Architecture("SCNet"),
    Architecture("GRoIE"),
    Architecture("PointRend"),
    Architecture("CARAFE"),
    Architecture("FPG"),
    Architecture("DetectoRS's recursive feature pyramid (RFP)"),
    Architecture("DetectoRS's switchable atrous convolution (SAC)"),
)
RUNS: tuple[Architecture, ...] = tuple(a for a in ARCHITECTURES if a.runs)  # those minidet runs
NOT_YET: tuple[Architecture, ...] = tuple(a for a in ARCHITECTURES if not a.runs)  # those it does not run yet


def _value(cfg, key: str) -> Any:
    return reduce(lambda node, part: node[part], key.split("."), cfg)


def turned_on(cfg, defaults) -> list[Architecture]:
    """The entries of ``ARCHITECTURES`` that the config ``cfg`` turns on (any of their ``switches`` away from its
    value in ``defaults``, minidet's default config), in table order."""
    return [a for a in ARCHITECTURES if any(_value(cfg, k) != _value(defaults, k) for k in a.switches)]


def settings() -> dict[str, tuple[Any, Any]]:
    """Every entry's config keys (``settings``): key -> (default, rule)."""
    return {k: v for a in ARCHITECTURES for k, v in a.settings.items()}


def unsupported_ops() -> dict[str, dict[str, str]]:
    """Runtime -> {ONNX operator: what it is} of the operators of the entries' graphs it cannot run (``lacks``)."""
    out: dict[str, dict[str, str]] = {}
    for a in ARCHITECTURES:
        for runtime, (op, what) in a.lacks.items():
            out.setdefault(runtime, {})[op] = what
    return out


def rules() -> tuple[Rule, ...]:
    """Every entry's checks across config keys, in table order."""
    return tuple(r for a in ARCHITECTURES for r in a.rules)


SET_ASIDE: tuple[SetAside, ...] = (
    SetAside("batch-norm update counters", {_ANY: r".+\.num_batches_tracked$"}),
    SetAside("SGD momenta", {"detectron": r".+_momentum$"}),
    # what Detectron carries over from the ImageNet file it started from: the classifier, and the zero biases that
    # its Caffe-to-pickle converter gave the bias-less convs
    SetAside("ImageNet classifier and zero conv biases kept from initialization",
             {"detectron": r"(?:fc1000_[wb]|pred_[wb]|conv1_b|res\d_\d+_branch(?:1|2[abc])_b)$"}),
    SetAside("pixel statistics (the config's MODEL.PIXEL_MEAN and PIXEL_STD apply, as in detectron2)",
             {"detectron2": r"pixel_(?:mean|std)$"}),
    SetAside("stored anchors (generated, as the source does)", {
        "detectron2": r"proposal_generator\.anchor_generator\.cell_anchors\.\d+$",
        "maskrcnn_benchmark": r"rpn\.anchor_generator\.cell_anchors\.\d+$",  # its check_anchors compares them
    }),
    SetAside("exponential moving averages of the weights (mmcv's EMAHook buffers)", {"mmdetection": r"ema_"}),
    # PanopticFPN: the instances come from the box and mask heads alone; the semantic head feeds only the
    # semantic and panoptic outputs (detectron2's PanopticFPN.inference, mmdetection's TwoStagePanopticSegmentor)
    SetAside("panoptic segmentation's semantic head (no instance detection reads it)",
             {"detectron2": r"sem_seg_head\.", "mmdetection": r"semantic_head\."}),
)


def _patterns(family: str, table: tuple) -> list[tuple[Architecture | SetAside, re.Pattern]]:
    """(entry, compiled pattern) of ``table``'s entries for ``family``'s files."""
    return [(e, re.compile(e.keys[f])) for e in table for f in (family, _ANY) if f in e.keys]


def set_aside(family: str, key: str) -> str | None:
    """Why ``key`` of a ``family`` file plays no part at inference (``SetAside.what``), else None."""
    return next((e.what for e, p in _patterns(family, SET_ASIDE) if p.match(key)), None)


def _held(family: str, keys: Iterable[str], skip: Collection[str] = ()) -> dict[str, tuple[Architecture, list[str]]]:
    """Name -> (entry, its keys) of the ``ARCHITECTURES`` entries (but those named in ``skip``) whose keys are among
    ``keys`` (of a ``family`` file); a key counts for the first entry it matches."""
    found: dict[str, tuple[Architecture, list[str]]] = {}
    patterns = [(a, p) for a, p in _patterns(family, ARCHITECTURES) if a.name not in skip]
    for key in keys:
        if arch := next((a for a, p in patterns if p.match(key)), None):
            found.setdefault(arch.name, (arch, []))[1].append(key)
    return found


def other_architectures(family: str, keys: Iterable[str],
                        skip: Collection[str] = ()) -> list[tuple[Architecture, list[str]]]:
    """The ``ARCHITECTURES`` entries (but those named in ``skip``) whose keys are among ``keys`` (of a ``family`` file),
    in table order, each with its keys (a key counts for the first entry it matches; an entry another found one
    ``includes`` counts for that)."""
    found = _held(family, keys, skip)
    for outer in list(found.values()):
        for name in outer[0].includes:
            if name in found:
                outer[1].extend(found.pop(name)[1])
    order = [a.name for a in ARCHITECTURES]
    return sorted(found.values(), key=lambda f: order.index(f[0].name))


def _and(names: list[str], word: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {word} " + names[-1]


def refuse_other_architecture(family: str, keys: Iterable[str], path: str, on: Collection[str] = ()) -> None:
    """Raise CheckpointError (one line: the file, each architecture with an example key and the count, and the
    config that runs it or that none does) when ``keys``, the keys of a ``family`` file that the model takes none
    of (or all its keys, with ``on`` the names of the entries the config turns on), name layers of an ``ARCHITECTURES``
    architecture (but those in ``on``)."""
    found = other_architectures(family, keys, on)
    if not found:
        return

    def part(arch: Architecture, names: list[str]) -> str:
        more = f" and {len(names) - 1} more keys" if len(names) > 1 else ""
        return f"{arch.name} ({names[0]}{more})"

    what = _and([part(a, k) for a, k in found])
    configs = [a.config.get(family, "") for a, _ in found]
    if len(found) == 1:
        tail = f"minidet runs it with the config {configs[0]}" if configs[0] else \
            "an architecture minidet does not run yet; no shipped config runs it"
    elif any(configs):
        each = "; ".join(f"{a.name}: {c or 'none yet'}" for (a, _), c in zip(found, configs))
        tail = (f"each runs with its own config ({each}); a file with them all needs a config with them all "
                f"(`minidet configs` lists the shipped ones)" if all(configs) else
                f"no shipped config runs them all (the configs: {each})")
    else:
        tail = "architectures minidet does not run yet; no shipped config runs them"
    raise CheckpointError(f"{path}: the checkpoint holds {what}: {tail}")


def refuse_config_mismatch(family: str, keys: Collection[str], on: Collection[str], path: str) -> None:
    """Raise CheckpointError (one line naming the file, what it holds and the config that runs it) when ``keys``
    (those of a ``family`` file that the config can take) and the config disagree about an architecture of
    ``ARCHITECTURES``: the file has keys of an entry that the config leaves off (not in ``on``, the names of the entries
    whose ``switches`` it sets; see :func:`refuse_other_architecture`), or the config turns on an entry that has a
    pattern for the family and the file has none of its keys. Run before anything is built."""
    refuse_other_architecture(family, keys, path, on)
    held = _held(family, keys)
    lacking = [a for a in ARCHITECTURES if a.name in on and family in a.keys and a.name not in held]
    if not lacking:
        return
    found = [a for a, _ in other_architectures(family, keys)]
    holds = f"a Mask R-CNN with {_and([a.name for a in found])}" if found else "a plain Mask R-CNN"
    if not found:
        fits = f"a plain Mask R-CNN config, such as {PLAIN[family]}"
    elif len(found) == 1 and found[0].config.get(family):
        fits = f"the config {found[0].config[family]}"
    else:
        fits = f"a config with {_and([a.name for a in found])} (`minidet configs` lists the shipped ones)"
    raise CheckpointError(
        f"{path}: the checkpoint holds {holds}, without {_and([a.name for a in lacking], 'or')} keys, but the config "
        f"turns {'it' if len(lacking) == 1 else 'them'} on ({', '.join(k for a in lacking for k in a.switches)}): "
        f"minidet runs the file with {fits}")
