"""What a checkpoint may hold beside the Mask R-CNN that minidet builds: two tables, each entry with its key names
as each family spells them (family name -> a pattern that ``re.match``es the file's key names).

- ``NOT_RUN``: architectures beyond the plain Mask R-CNN, those minidet does not run (yet) and those it runs under
  their own configs. A file with such keys that the model takes none of is refused in one line naming the
  architecture, an example key, the count and the config that runs it (:func:`refuse_other_architecture`). To run
  one: build its layers, map its keys in the family's rename rules (then the model takes them and nothing here
  fires), put the config's name in ``config`` under the family, which the message then offers to those who load
  such a file with another config, and the config keys that turn it on in ``switches``: then a file and a config
  that disagree about it are one line in either direction before anything is built (:func:`refuse_config_mismatch`:
  the file has its keys and the config leaves it off, or the config turns it on and the file has none of them).
- ``SET_ASIDE``: keys known to play no part at inference (training state, copies of the weights, heads no
  detection reads). The families' renamers drop them (:func:`set_aside`) and the load report names each with its
  reason.

Every other key that no layer of the model takes is refused (``checkpoint.load_checkpoint``): minidet runs a file
only as a whole, so that its detections are the source's. Importing this needs no torch.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import CheckpointError

_ANY = "*"  # a SetAside key for every family


@dataclass(frozen=True)
class Architecture:
    """An architecture beyond the plain Mask R-CNN. ``name``: as its users know it; ``keys``: family name -> pattern
    of the key names only its files have; ``config``: family name -> the shipped config that runs it (a family
    without one: none yet); ``includes``: the names of the entries whose keys its files hold too (a Hybrid Task
    Cascade is a cascade), not named apart; ``switches``: the config keys that turn it on, any of them away from
    minidet's default (none: minidet does not run it)."""

    name: str
    keys: Mapping[str, str]
    config: Mapping[str, str] = field(default_factory=dict)
    includes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


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

_LSJ = "detectron2's LSJ new baseline (two RPN convs)"

NOT_RUN: tuple[Architecture, ...] = (
    Architecture("deformable convolution (DCN)", {
        "mmdetection": _BLOCK["mmdetection"] + r"conv2(?:\.conv_offset|_offset)\.",  # mmcv's *Pack; 1.x's name
        "detectron2": _BLOCK["detectron2"] + r"conv2_offset\.",  # DeformBottleneckBlock
        "maskrcnn_benchmark": _BLOCK["maskrcnn_benchmark"] + r"conv2\.(?:offset|conv)\.",  # DFConv2d
    }, config={"mmdetection": "mmdetection/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco",
               "detectron2": "detectron2/mask_rcnn_R_50_FPN_1x_dconv_c3-c5"},
        switches=("MODEL.RESNETS.DEFORM_ON_PER_STAGE",)),
    Architecture("global context blocks (GCNet)", {"mmdetection": _BLOCK["mmdetection"] + r"context_block\w*\."},
                 config={"mmdetection": "mmdetection/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco"},
                 switches=("MODEL.RESNETS.CONTEXT_ON_PER_STAGE",)),
    Architecture("generalized attention blocks (empirical attention)",
                 {"mmdetection": _BLOCK["mmdetection"] + r"gen_attention_block\w*\."}),
    Architecture("non-local blocks", {"mmdetection": _BLOCK["mmdetection"] + r"nonlocal_block\w*\."}),
    Architecture("RegNet backbone", {"detectron2": r"backbone\.bottom_up\.(?:stem\.(?:conv|bn)|s\d+\.b\d+)\."},
                 # mmdetection's RegNet has its ResNet's key names: families.check_body tells them by the stem
                 config={"detectron2": "detectron2/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ",
                         "mmdetection": "mmdetection/mask-rcnn_regnetx-3.2GF_fpn_1x_coco"},
                 includes=(_LSJ,), switches=("MODEL.REGNET.DEPTH",)),  # detectron2's RegNet files are LSJ ones
    # detectron2's new baselines: of its model zoo only they have an RPN head of two convs (and with it SyncBN in
    # the FPN and heads, the 4conv1fc box head): its keys tell them from the plain model and the SyncBN ones
    Architecture(_LSJ, {"detectron2": r"proposal_generator\.rpn_head\.conv\.conv\d\."},
                 config={"detectron2": "detectron2/mask_rcnn_R_50_FPN_100ep_LSJ"}, switches=("MODEL.RPN.CONV_DEPTH",)),
    Architecture("Hybrid Task Cascade (HTC)",
                 {"mmdetection": r"roi_head\.(?:semantic_head|mask_head\.\d+\.conv_res)\."},
                 includes=("Cascade R-CNN",)),
    Architecture("Cascade R-CNN", {
        "mmdetection": r"roi_head\.(?:bbox|mask)_head\.\d+\.",
        "detectron2": r"roi_heads\.box_(?:head|predictor)\.\d+\.",
        "detectron": r".+_(?:2nd|3rd)_[wb]$",  # Detectron-Cascade-RCNN's second and third stages
    }, config={"mmdetection": "mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco",
               "detectron2": "detectron2/cascade_mask_rcnn_R_50_FPN_1x"},
        switches=("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS",)),
    Architecture("Mask Scoring R-CNN (mask IoU head)", {
        "mmdetection": r"roi_head\.mask_iou_head\.",
        "maskrcnn_benchmark": r"roi_heads\.maskiou\.",
    }, config={"mmdetection": "mmdetection/ms-rcnn_r50-caffe_fpn_1x_coco"}, switches=("MODEL.MASKIOU_ON",)),
    # mmdetection's PanopticFPN: its instances are those of its instance branch under that branch's own test settings
    # (one class-agnostic NMS, MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC, score 0.6), not the plain Mask R-CNN's; its
    # semantic head is set aside (SET_ASIDE). detectron2's PanopticFPN tests its instances as the plain model does
    # (and its configs are the plain ones): its semantic head is only set aside
    Architecture("Panoptic FPN (semantic head)", {"mmdetection": r"semantic_head\."},
                 config={"mmdetection": "mmdetection/panoptic-fpn_r50_fpn_1x_coco"},
                 switches=("MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC",)),
    Architecture("Keypoint R-CNN (keypoint head)", {
        "torchvision": r"roi_heads\.keypoint_(?:head|predictor)\.",
        "detectron2": r"roi_heads\.keypoint_head\.",
        "maskrcnn_benchmark": r"roi_heads\.keypoint\.",
        "detectron": r"(?:kps_\w+|conv_fcn\d+)_[wb]$",
    }),
)

PLAIN: Mapping[str, str] = {  # family name -> the shipped config of its plain R-50 Mask R-CNN
    "torchvision": "torchvision/maskrcnn_resnet50_fpn",
    "detectron": "detectron/e2e_mask_rcnn_R-50-FPN_1x",
    "detectron2": "detectron2/mask_rcnn_R_50_FPN_3x",
    "maskrcnn_benchmark": "maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x",
    "mmdetection": "mmdetection/mask-rcnn_r50_fpn_1x_coco",
}

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
    """Name -> (entry, its keys) of the ``NOT_RUN`` entries (but those named in ``skip``) whose keys are among
    ``keys`` (of a ``family`` file); a key counts for the first entry it matches."""
    found: dict[str, tuple[Architecture, list[str]]] = {}
    patterns = [(a, p) for a, p in _patterns(family, NOT_RUN) if a.name not in skip]
    for key in keys:
        if arch := next((a for a, p in patterns if p.match(key)), None):
            found.setdefault(arch.name, (arch, []))[1].append(key)
    return found


def other_architectures(family: str, keys: Iterable[str],
                        skip: Collection[str] = ()) -> list[tuple[Architecture, list[str]]]:
    """The ``NOT_RUN`` entries (but those named in ``skip``) whose keys are among ``keys`` (of a ``family`` file),
    in table order, each with its keys (a key counts for the first entry it matches; an entry another found one
    ``includes`` counts for that)."""
    found = _held(family, keys, skip)
    for outer in list(found.values()):
        for name in outer[0].includes:
            if name in found:
                outer[1].extend(found.pop(name)[1])
    order = [a.name for a in NOT_RUN]
    return sorted(found.values(), key=lambda f: order.index(f[0].name))


def _and(names: list[str], word: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {word} " + names[-1]


def refuse_other_architecture(family: str, keys: Iterable[str], path: str, on: Collection[str] = ()) -> None:
    """Raise CheckpointError (one line: the file, each architecture with an example key and the count, and the
    config that runs it or that none does) when ``keys``, the keys of a ``family`` file that the model takes none
    of (or all its keys, with ``on`` the names of the entries the config turns on), name layers of a ``NOT_RUN``
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
    ``NOT_RUN``: the file has keys of an entry that the config leaves off (not in ``on``, the names of the entries
    whose ``switches`` it sets; see :func:`refuse_other_architecture`), or the config turns on an entry that has a
    pattern for the family and the file has none of its keys. Run before anything is built."""
    refuse_other_architecture(family, keys, path, on)
    held = _held(family, keys)
    lacking = [a for a in NOT_RUN if a.name in on and family in a.keys and a.name not in held]
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
