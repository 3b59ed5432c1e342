"""Configuration: yacs defaults, ``_BASE_`` inheritance, validation (only ``build_*`` functions read a config)."""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import re
from functools import reduce
from pathlib import Path
from typing import Any

import yaml
from yacs.config import CfgNode as _YacsNode

from .bodies import Body, body_kind
from .categories import LAYOUTS as CATEGORY_LAYOUTS
from .categories import names_problem
from .errors import ConfigError, shown
from .families import FAMILIES, architectures, family_mismatch
from .families.architectures import CASCADE, DCN, GC_BLOCKS, MASK_SCORING, REGNET
from .imageio import DEFAULT_MAX_PIXELS
from .runtimes import PRECISIONS, RUNTIMES, precision_problem

MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; a larger file is another kind of file
CONFIG_DIR = Path(__file__).parent / "configs"  # the shipped configs (configs/ in a checkout links here)


class CfgNode(_YacsNode):
    """yacs node with ``_BASE_`` inheritance, int->float coercion and one-line errors."""

    def merge_from_file(self, cfg_filename: str) -> None:
        """Merge a yaml file or shipped config name (``config_file``) and, first, the ``_BASE_`` files it names.
        Relative paths in a file resolve beside it (``_beside``)."""
        for path, data in _base_chain(config_file(cfg_filename)):
            try:
                _merge_dict(self, _beside(data, os.path.dirname(path)), [])
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None

    def merge_from_list(self, cfg_list: list[Any]) -> None:
        """Merge ``KEY VALUE`` pairs, e.g. ``["MODEL.NORM", "Affine"]``."""
        if len(cfg_list) % 2:
            raise ConfigError(f"overrides must be KEY VALUE pairs; got an odd number: {cfg_list}")
        for full_key, raw in zip(cfg_list[0::2], cfg_list[1::2]):
            *parents, leaf = str(full_key).split(".")
            node = reduce(lambda n, p: n.get(p) if isinstance(n, _YacsNode) else None, parents, self)
            if not isinstance(node, _YacsNode) or leaf not in node:
                raise ConfigError(f"unknown config key: {full_key}")
            node[leaf] = _coerce(_YacsNode._decode_cfg_value(raw), node[leaf], full_key)


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one mapping."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in first:
                    line = first[key].start_mark.line + 1
                    raise _DuplicateKey(None, None, f"key {key} given twice in one mapping (first on line {line})",
                                        key_node.start_mark)
                first[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _at(path: str, line: int, column: int) -> str:
    """``path:line:column``, both counted from 1 (``line``, ``column`` from 0, as in yaml marks)."""
    return f"{path}:{line + 1}:{column + 1}"


def _at_index(path: str, text: str, index: int) -> str:
    """``path:line:column`` of character ``index`` of ``text``."""
    return _at(path, text.count("\n", 0, index), index - (text.rfind("\n", 0, index) + 1))


def _yaml_reason(e: yaml.YAMLError) -> str:
    """PyYAML's complaint on one line, tabs explained."""
    if isinstance(e, _DuplicateKey):
        return str(e.problem)
    problem = str(getattr(e, "problem", None) or e)
    if "'\\t'" in problem:
        return "not valid YAML: a tab character (YAML allows no tabs here: indent with spaces)"
    context, mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and mark is not None:
        context = f"{context} from line {mark.line + 1}"
    return " ".join(f"not valid YAML: {problem}{f' ({context})' if context else ''}".split())


def _load_yaml(path: str) -> tuple[dict, yaml.Node | None]:
    """The top-level mapping of the config file ``path`` and its ``_BASE_`` value's node."""
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a folder, not a config file")
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        head = raw[: e.start].decode("utf-8-sig")  # the valid text before the first bad byte
        raise ConfigError(f"{_at_index(path, head, len(head))}: not UTF-8 text (byte 0x{raw[e.start]:02x})") from None
    loader = None
    try:
        loader = _StrictLoader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = _at(path, mark.line, mark.column) if mark is not None else path
        raise ConfigError(f"{where}: {_yaml_reason(e)}") from None
    except yaml.reader.ReaderError as e:
        raise ConfigError(f"{_at_index(path, text, e.position)}: not valid YAML: character U+{e.character:04X}: "
                          f"{e.reason}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: {_yaml_reason(e)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if data is None:
        return {}, None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at top level")
    base = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "_BASE_"), None)
    return data, base


def _base_chain(path: str, seen: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """(file, its mapping without ``_BASE_``) to merge in order: the deepest ``_BASE_`` first."""
    path = os.path.abspath(path)
    if path in seen:
        raise ConfigError(f"{path}: _BASE_ cycle")
    data, node = _load_yaml(path)
    base = data.pop("_BASE_", None)
    if base is None:
        return [(path, data)]
    if not isinstance(base, str) or not base:
        where = _at(path, node.start_mark.line, node.start_mark.column) if node is not None else path
        kind = {list: "a list", dict: "a mapping", bool: "a boolean", int: "a number", float: "a number"}
        what = f"{kind.get(type(base), type(base).__name__)}: {shown(base)}" if base != "" else "an empty string"
        raise ConfigError(f"{where}: _BASE_ must name one file (a string); got {what}")
    base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
    if not os.path.exists(base_path):
        raise ConfigError(f"{path}: _BASE_ file not found: {base}")
    if os.path.isdir(base_path):
        raise ConfigError(f"{path}: _BASE_ {base} is a folder, not a config file")
    return _base_chain(base_path, (*seen, path)) + [(path, data)]


def _beside(data: dict, folder: str) -> dict:
    """A config file's mapping with the paths that are relative to the file made absolute (``folder``: the file's),
    so that a folder holding a config and its files (``minidet export``'s) can be copied or moved: ``MODEL.GRAPH``
    when relative, ``MODEL.WEIGHTS`` when it starts with ``./`` or ``../`` (other relative weights, such as the
    shipped configs' ``weights/<file>``, are looked for by ``hub.weights_path``: the current folder,
    ``$MINIDET_HOME``, the checkout)."""
    model = data.get("MODEL")
    if not isinstance(model, dict):
        return data
    model = dict(model)
    for key in ("GRAPH", "WEIGHTS"):
        value = model.get(key)
        if not isinstance(value, str) or not value.strip() or os.path.isabs(os.path.expanduser(value)):
            continue
        if key == "GRAPH" or value.startswith(("./", "../", f".{os.sep}", f"..{os.sep}")):
            model[key] = os.path.normpath(os.path.join(folder, value))
    return {**data, "MODEL": model}


def _coerce(value: Any, original: Any, key: str) -> Any:
    """``value`` as the type of the default ``original`` (an int stands for a float, a list for a tuple)."""
    if original is None or value is None:
        return value
    if isinstance(original, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(original)(value)
    if isinstance(original, (list, tuple)) and isinstance(value, str):  # "cell,nucleus,debris" on a command line
        items = [v.strip() for v in value.split(",")] if value.strip() else []  # "": the empty list
        if "" in items:
            raise ConfigError(f"config key {key}: item {items.index('') + 1} of {value!r} is empty (a list here is "
                              "comma-separated values, none of them empty)")
        return type(original)(items)
    if isinstance(original, float) and isinstance(value, str):
        with contextlib.suppress(ValueError):  # YAML 1.1 reads "1e-5" (no dot) as a string
            return float(value)
    accepted = {bool: bool, int: int, float: (int, float), str: str}.get(type(original), ())
    if isinstance(value, accepted) and isinstance(value, bool) == isinstance(original, bool):  # a bool is no int
        return float(value) if isinstance(original, float) else value
    raise ConfigError(f"config key {key}: expected {type(original).__name__} (like {original!r}), got {value!r}")


def _merge_dict(node: _YacsNode, data: dict, prefix: list[str]) -> None:
    for k, v in data.items():
        full = ".".join([*prefix, str(k)])
        if k not in node:
            raise ConfigError(f"unknown config key: {full}")
        if isinstance(node[k], _YacsNode):
            if not isinstance(v, dict):
                raise ConfigError(f"config key {full}: expected a mapping, got {v!r}")
            _merge_dict(node[k], v, [*prefix, str(k)])
        else:
            node[k] = _coerce(v, node[k], full)


# Every key: (default, rule). A rule is a tuple of choices, or an interval ("[" / "]" closed, "(" / ")" open),
# prefixed with "N x" for a list of N values or "n x" for a list of one or more; None: a boolean (True or False)
# or a free string. The kind (integer or number) is that of the default. Upper bounds on sizes and counts only
# catch typos. docs/configs.md says what each key means.
_DEFAULTS: dict[str, tuple[Any, tuple | str | None]] = {
    "MODEL.WEIGHTS": ("", None),
    "MODEL.DEVICE": ("cpu", ("cpu", "cuda", "cuda:N")),
    "MODEL.MASK_ON": (True, None),
    **MASK_SCORING.settings,  # the architectures' own keys: families/architectures.py
    "MODEL.NORM": ("FrozenBN", ("FrozenBN", "BN", "Affine", "GN")),  # wherever the architecture normalizes
    # the RoI heads' norm where they normalize ('': MODEL.NORM; detectron2's X-152 cascade: frozen BN, GN heads)
    "MODEL.HEAD_NORM": ("", ("", "FrozenBN", "BN", "Affine", "GN")),
    "MODEL.FOLD_NORM": (False, None),  # fold FrozenBN/BN/Affine into the preceding conv at load time
    # every conv followed by a norm standardizes its kernel, as mmcv's ConvWS (mmdetection's gn+ws), once at load time
    "MODEL.WEIGHT_STANDARDIZATION": (False, None),
    "MODEL.CHANNELS_LAST": (False, None),  # NHWC convolutions: only the float summation order changes
    "MODEL.FUSE_CONVS": (True, None),  # CPU float32: conv + ReLU / sum as one oneDNN call, same values
    "MODEL.FUSE_LINEAR": (False, None),  # CPU float32: fcs, mask deconv on oneDNN; mask of the box's class only
    # poolers.ROI_ALIGN_IMPLS (not imported: configs are read without torch); gather: only the float sum order differs
    "MODEL.ROI_ALIGN_IMPL": ("gather", ("gather", "torchvision")),
    "MODEL.FROZEN_BN_EPS": (1e-5, "[0, 1)"),  # belongs to the weights (torchvision COCO_V1: 0.0)
    "MODEL.GN_NUM_GROUPS": (32, "[1, 1024]"),
    "MODEL.GN_EPS": (1e-5, "[0, 1)"),
    # pixel statistics in the units of INPUT.PIXEL_RANGE, in INPUT.FORMAT channel order
    "MODEL.PIXEL_MEAN": ([123.675, 116.28, 103.53], "3 x (-inf, inf)"),
    "MODEL.PIXEL_STD": ([58.395, 57.12, 57.375], "3 x (0, inf)"),
    "MODEL.CATEGORY_LAYOUT": ("coco91", CATEGORY_LAYOUTS),  # class index -> COCO id (categories.py)
    "MODEL.CLASS_NAMES": ([], None),  # a checkpoint's own classes, in class order (else its own names, or class_N)
    "MODEL.CONVENTION": ("torchvision", tuple(FAMILIES)),  # the weights' family and its arithmetic (families/)
    "MODEL.RUNTIME": ("torch", ("torch", *RUNTIMES)),  # the network: torch, or MODEL.GRAPH's runtime (runtimes.py)
    "MODEL.GRAPH": ("", None),  # the model.onnx of `minidet export`, for MODEL.RUNTIME onnxruntime / openvino
    "MODEL.GRAPH_SHA256": ("", None),  # MODEL.GRAPH's SHA-256, checked before the graph is opened ('': unchecked)
    # what the runtime of MODEL.GRAPH computes in (runtimes.py): fp32 whatever the CPU; bf16 (OpenVINO, CPUs
    # with bf16) on request; int8 (OpenVINO, the model.xml of `minidet export --precision int8`)
    "MODEL.RUNTIME_PRECISION": ("fp32", tuple(PRECISIONS)),
    "MODEL.RESNETS.DEPTH": (50, (50, 101, 152)),
    "MODEL.RESNETS.STRIDE_IN_1X1": (False, None),
    "MODEL.RESNETS.NUM_GROUPS": (1, "[1, 256]"),
    "MODEL.RESNETS.WIDTH_PER_GROUP": (64, "[1, 1024]"),
    **DCN.settings,
    **GC_BLOCKS.settings,
    **REGNET.settings,
    "MODEL.FPN.OUT_CHANNELS": (256, "[1, 4096]"),
    "MODEL.FPN.USE_NORM": (False, None),
    "MODEL.ANCHOR_GENERATOR.SIZES": ([32, 64, 128, 256, 512], "5 x (0, 16384]"),  # one per level, P2 to P6
    "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": ([0.5, 1.0, 2.0], "n x (0, inf)"),
    "MODEL.RPN.CONV_DEPTH": (1, "[0, 16]"),
    "MODEL.RPN.PRE_NMS_TOPK_TEST": (1000, "[1, 1000000]"),
    "MODEL.RPN.POST_NMS_TOPK_TEST": (1000, "[1, 1000000]"),
    "MODEL.RPN.NMS_THRESH": (0.7, "(0, 1]"),
    "MODEL.RPN.MIN_SIZE": (1e-3, "[0, inf)"),
    "MODEL.RPN.TORCHVISION_TIE_ORDER": (False, None),  # equal scores in torchvision's order: slower, same detections
    # heads.roi.ROI_HEADS (not imported: configs are read without torch): the box stage, or Cascade R-CNN's stages
    # (MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS), then the mask stage(s) and MODEL.MASKIOU_ON's scorer
    "MODEL.ROI_HEADS.NAME": ("StandardROIHeads", ("StandardROIHeads", "CascadeROIHeads")),
    "MODEL.ROI_HEADS.NUM_CLASSES": (91, "[1, 100000]"),
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST": (0.05, "[0, 1]"),
    "MODEL.ROI_HEADS.NMS_THRESH_TEST": (0.5, "(0, 1]"),
    "MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC": (False, None),  # one NMS over every class's boxes (mmdetection's panoptic)
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE": (100, "[1, 100000]"),
    "MODEL.ROI_HEADS.MIN_BOX_SIZE": (1e-2, "[0, inf)"),
    "MODEL.ROI_BOX_HEAD.NUM_CONV": (0, "[0, 16]"),
    "MODEL.ROI_BOX_HEAD.CONV_DIM": (256, "[1, 4096]"),
    "MODEL.ROI_BOX_HEAD.NUM_FC": (2, "[0, 8]"),
    "MODEL.ROI_BOX_HEAD.FC_DIM": (1024, "[1, 16384]"),
    "MODEL.ROI_BOX_HEAD.USE_NORM": (False, None),
    "MODEL.ROI_BOX_HEAD.NORM_FC": (False, None),  # bias-free fcs, each followed by MODEL.NORM (GN only)
    "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": (7, "[1, 32]"),
    "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": (2, "[0, 64]"),  # 0: adaptive
    "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": ([10.0, 10.0, 5.0, 5.0], "4 x (0, inf)"),
    "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG": (False, None),  # one set of deltas for every class (from the weights)
    **CASCADE.settings,
    "MODEL.ROI_MASK_HEAD.NUM_CONV": (4, "[0, 16]"),
    "MODEL.ROI_MASK_HEAD.CONV_DIM": (256, "[1, 4096]"),
    "MODEL.ROI_MASK_HEAD.USE_NORM": (False, None),
    "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": (14, "[1, 32]"),
    "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": (2, "[0, 64]"),
    "MODEL.ROI_MASK_HEAD.THRESHOLD": (0.5, "[0, 1]"),
    "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK": (False, None),  # one mask channel for every class (from the weights)
    "INPUT.MIN_SIZE_TEST": (800, "[1, 16384]"),
    "INPUT.MAX_SIZE_TEST": (1333, "[1, 16384]"),
    "INPUT.FORMAT": ("RGB", ("RGB", "BGR")),  # channel order the network expects
    "INPUT.PIXEL_RANGE": (255.0, "(0, inf)"),  # pixels are scaled to [0, PIXEL_RANGE] before mean/std
    "INPUT.SIZE_DIVISIBILITY": (32, "[1, 1024]"),
    "INPUT.MAX_PIXELS": (DEFAULT_MAX_PIXELS, "[0, inf)"),  # refuse larger images; 0: no limit
    "TEST.IMS_PER_BATCH": (1, "[1, 1024]"),
    "TEST.CHUNK_IMAGES": (0, "[0, inf)"),  # images per network run; 0: one on CPU, all on CUDA; same detections
    "TEST.TIMING": (True, None),  # per-stage times (CUDA-synchronized on GPU)
    "TEST.AMP": ("", ("", "bf16", "fp16")),  # autocast of the network layers (bf16 also on CPU); changes detections
}


def _tree(table: dict[str, tuple[Any, Any]]) -> CfgNode:
    """The config whose leaves are the defaults of ``table``, in its order."""
    root = CfgNode()
    for key, (default, _) in table.items():
        *parents, leaf = key.split(".")
        reduce(lambda node, p: node.setdefault(p, CfgNode()), parents, root)[leaf] = default
    return root


_C = _tree(_DEFAULTS)
RULES: dict[str, tuple | str] = {key: rule for key, (_, rule) in _DEFAULTS.items() if rule is not None}


def get_cfg(config: str | None = None) -> CfgNode:
    """A fresh copy of minidet's default config, merged with ``config`` (a file or a shipped config's name, e.g.
    ``"detectron/e2e_mask_rcnn_R-50-FPN_1x"``) when given."""
    cfg = _C.clone()
    if config is not None:
        cfg.merge_from_file(config)
    return cfg


def load_cfg(file: str, opts: list | tuple = ()) -> CfgNode:
    """The config a program runs: minidet's defaults merged with ``file`` (a path or a shipped config's name), then
    with the ``KEY VALUE`` pairs ``opts``, validated (:func:`validate_cfg`) and frozen. The one loader of the
    programs; ``prepare_model`` and ``build_model`` do not validate it again while it is unchanged
    (:func:`check_cfg`)."""
    cfg = get_cfg(file)
    cfg.merge_from_list(list(opts))
    validate_cfg(cfg)
    cfg.freeze()
    return cfg


def config_names(bases: bool = False) -> list[str]:
    """The shipped configs' names (their path under ``CONFIG_DIR``, no ``.yaml``), sorted; ``Base-*`` files too
    with ``bases``."""
    names = (p.relative_to(CONFIG_DIR).with_suffix("").as_posix() for p in CONFIG_DIR.rglob("*.yaml"))
    return sorted(n for n in names if bases or not n.rpartition("/")[2].startswith("Base-"))


def close_names(text: str, names: list[str]) -> list[str]:
    """Up to 4 of ``names`` near ``text`` (a mistyped config or registry name): the closest by spelling, then those
    that hold its last part (``mask_rcnn_R_50_FPN_3x`` finds ``detectron2/mask_rcnn_R_50_FPN_3x``)."""
    close = difflib.get_close_matches(text, names, n=4, cutoff=0.6)
    part = text.rpartition("/")[2].lower()
    return close + [n for n in names if part in n.lower() and n not in close][: 4 - len(close)]


def config_file(name: str) -> str:
    """The file ``name`` names: an existing path as given, else a shipped config (``torchvision/maskrcnn_resnet50_fpn``;
    a ``.yaml`` suffix and a leading ``configs/`` are allowed, so a checkout's paths work from any folder). Neither:
    ConfigError listing the close names."""
    if os.path.exists(name):
        return name
    stem = re.sub(r"\.ya?ml$", "", re.sub(r"^(\./)?configs/", "", str(name).replace(os.sep, "/")))
    if (CONFIG_DIR / f"{stem}.yaml").is_file() and ".." not in stem.split("/"):
        return str(CONFIG_DIR / f"{stem}.yaml")
    close = close_names(stem, config_names(bases=True))
    if not close and re.search(r"\.ya?ml$", str(name)):  # a file path, and no shipped name near it
        raise ConfigError(f"config file not found: {os.path.abspath(name)}")
    hint = f"; close names: {', '.join(close)}" if close else ""
    raise ConfigError(f"config file not found: {os.path.abspath(name)}, and {stem} is not a config name{hint} "
                      "(`minidet configs` lists them)")


def own_settings(name: str) -> list:
    """The ``KEY VALUE`` pairs (a flat list) that the config ``name`` (a path or a shipped config's name) sets
    itself, not those of its ``_BASE_`` chain, ``MODEL.WEIGHTS`` aside: what a variant takes from it."""

    def flat(data: dict, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    own = flat(_base_chain(config_file(name))[-1][1], "")
    return [kv for k, v in own.items() if k != "MODEL.WEIGHTS" for kv in (k, v)]


def leaves(node: _YacsNode, prefix: str = "") -> dict[str, Any]:
    """Every key of ``node`` that holds a value, by its full name."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, _YacsNode) else {f"{prefix}{k}": v})
    return out


def cfg_value(cfg: _YacsNode, key: str) -> Any:
    """The value of the dotted ``key`` (``MODEL.ROI_HEADS.NUM_CLASSES``) in ``cfg``."""
    return reduce(lambda node, part: node[part], key.split("."), cfg)


def _interval(rule: str) -> tuple[str, float, float, str]:
    """``"N x [lo, hi)"`` -> (``"N"`` or ``""``, lo, hi, the interval as written)."""
    count, _, interval = rule.rpartition(" x ")
    lo, hi = (float(s) for s in interval[1:-1].split(","))
    return count, lo, hi, interval


def _in(value: Any, interval: str, lo: float, hi: float, integer: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    above = value > lo if interval[0] == "(" else value >= lo
    below = value < hi if interval[-1] == ")" else value <= hi
    return math.isfinite(value) and above and below


def _allows(rule: tuple | str, value: Any, default: Any) -> bool:
    if isinstance(rule, tuple):  # a choice "cuda:N" stands for cuda:0, cuda:1, ...
        choices = (re.escape(str(c)).replace(":N", ":[0-9]+") for c in rule)
        return type(value) is type(default) and any(re.fullmatch(c, str(value)) for c in choices)
    count, lo, hi, interval = _interval(rule)
    if not count:
        return _in(value, interval, lo, hi, type(default) is int)
    if not isinstance(value, (list, tuple)):
        return False
    n_ok = len(value) > 0 if count == "n" else len(value) == int(count)
    return n_ok and all(_in(v, interval, lo, hi, False) for v in value)


def _describe(rule: tuple | str, default: Any) -> str:
    """The rule in words: "one of a, b, c", "an integer >= 1", "4 numbers, each > 0"..."""
    if isinstance(rule, tuple):
        names = [str(c) if c != "" else "''" for c in rule]
        return f"{names[0]} or {names[1]}" if len(names) == 2 else f"one of {', '.join(names)}"
    count, lo, hi, interval = _interval(rule)
    if lo == -math.inf and hi == math.inf:
        where = "finite"
    elif hi == math.inf:
        where = f"{'>' if interval[0] == '(' else '>='} {interval[1:].split(',')[0]}"
    else:
        where = f"in {interval}"
    if not count:
        return f"{'an integer' if type(default) is int else 'a number'} {where}"
    n = "one or more" if count == "n" else count
    return f"{n} finite numbers" if where == "finite" else f"{n} numbers, each {where}"


_VALIDATED = "__validated__"  # a node's attribute, not a key: the values (``repr``) that validate_cfg last passed


def check_cfg(cfg: CfgNode) -> None:
    """:func:`validate_cfg`, unless ``cfg`` holds the very values it last passed (``repr`` tells ``True`` from ``1``,
    ``1`` from ``1.0``; a clone carries them): a config is validated once per load, by :func:`load_cfg` or by the
    first of ``prepare_model`` and ``build_model`` that it reaches."""
    if cfg.__dict__.get(_VALIDATED) != repr(leaves(cfg)):
        validate_cfg(cfg)


def body_of(cfg: CfgNode) -> Body:
    """The bottom-up body's shapes ``cfg`` describes (its kind: ``bodies.BODIES``, e.g. ``MODEL.REGNET`` where its
    DEPTH is set, else ``MODEL.RESNETS``); parameters that give no such body: ConfigError."""
    try:
        return body_kind(cfg.MODEL).shape(cfg.MODEL)
    except ValueError as e:
        raise ConfigError(str(e)) from None


# The checks across keys, each a function of the config that gives its problem in one line or None, run in this
# order by validate_cfg after every key passed its own rule: the norm's, the graph's and its runtime's, the
# architectures' (their ``rules``, in table order: families/architectures.py), the box head's, the family's, the
# classes', GroupNorm's channels.


def _fold_norm(cfg: CfgNode) -> str | None:
    if cfg.MODEL.FOLD_NORM and cfg.MODEL.NORM == "GN":
        return "MODEL.FOLD_NORM applies to FrozenBN/BN/Affine only; GroupNorm cannot be folded"
    return None


def _graph_sha256(cfg: CfgNode) -> str | None:
    m = cfg.MODEL
    if m.GRAPH_SHA256 and not re.fullmatch(r"[0-9a-fA-F]{64}", str(m.GRAPH_SHA256)):
        return f"MODEL.GRAPH_SHA256 must be a SHA-256 (64 hexadecimal digits) or empty; got {shown(m.GRAPH_SHA256)}"
    return None


def _box_head_layers(cfg: CfgNode) -> str | None:
    if cfg.MODEL.ROI_BOX_HEAD.NUM_CONV == 0 and cfg.MODEL.ROI_BOX_HEAD.NUM_FC == 0:
        return "MODEL.ROI_BOX_HEAD needs at least one conv or fc layer"
    return None


def _norm_fc(cfg: CfgNode) -> str | None:
    m = cfg.MODEL
    if m.ROI_BOX_HEAD.NORM_FC and (m.HEAD_NORM or m.NORM) != "GN":
        return (f"MODEL.ROI_BOX_HEAD.NORM_FC needs GN (a norm after an fc) as MODEL.NORM or MODEL.HEAD_NORM; "
                f"got {m.HEAD_NORM or m.NORM}")
    return None


def _roi_heads_name(cfg: CfgNode) -> str | None:
    m = cfg.MODEL
    stages = m.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS
    if bool(stages) != (m.ROI_HEADS.NAME == "CascadeROIHeads"):
        return (f"MODEL.ROI_HEADS.NAME {m.ROI_HEADS.NAME} with {len(stages)} stages in "
                "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS: CascadeROIHeads takes 2 or more, StandardROIHeads none")
    return None


def _background_class(cfg: CfgNode) -> str | None:
    m = cfg.MODEL
    if m.ROI_HEADS.NUM_CLASSES < 2 and not FAMILIES[m.CONVENTION].background_last:
        return (f"MODEL.ROI_HEADS.NUM_CLASSES counts the background under MODEL.CONVENTION {m.CONVENTION}: it must "
                f"be >= 2; got {m.ROI_HEADS.NUM_CLASSES}")
    return None


def _class_names(cfg: CfgNode) -> str | None:
    names = cfg.MODEL.CLASS_NAMES
    if names and (problem := names_problem(names)):  # set in Python, a string: not its letters
        return (f"MODEL.CLASS_NAMES must be distinct, non-empty names: {problem}; got "
                f"{shown(list(names) if isinstance(names, (list, tuple)) else names)}")
    return None


def _gn_groups(cfg: CfgNode) -> str | None:
    """GroupNorm splits the channels of every normalized layer into equal groups."""
    m = cfg.MODEL
    head_norm = m.HEAD_NORM or m.NORM
    if "GN" not in (m.NORM, head_norm):
        return None
    normalized = {}
    if m.NORM == "GN":
        body, kind = body_of(cfg), body_kind(m).name
        normalized = {f"the {kind} stem": body.stem_channels}
        normalized.update({f"the {kind}'s res{i + 2} width": s.width for i, s in enumerate(body.stages)})
        normalized["MODEL.FPN.OUT_CHANNELS"] = m.FPN.OUT_CHANNELS if m.FPN.USE_NORM else 0
    for h in ("ROI_BOX_HEAD", "ROI_MASK_HEAD") if head_norm == "GN" else ():
        normalized[f"MODEL.{h}.CONV_DIM"] = m[h].CONV_DIM if m[h].USE_NORM and m[h].NUM_CONV else 0
    if head_norm == "GN":
        normalized["MODEL.ROI_BOX_HEAD.FC_DIM"] = m.ROI_BOX_HEAD.FC_DIM if m.ROI_BOX_HEAD.NORM_FC else 0
    return next((f"MODEL.GN_NUM_GROUPS {m.GN_NUM_GROUPS} must divide the channels GroupNorm normalizes: {what} is "
                 f"{channels}" for what, channels in normalized.items() if channels % m.GN_NUM_GROUPS), None)


CROSS_RULES: tuple[architectures.Rule, ...] = (
    _fold_norm,
    _graph_sha256,
    lambda cfg: precision_problem(cfg.MODEL.RUNTIME_PRECISION, cfg.MODEL.RUNTIME) or None,
    *architectures.rules(),
    _roi_heads_name,
    _box_head_layers,
    _norm_fc,
    lambda cfg: family_mismatch(cfg.MODEL.WEIGHTS, cfg.MODEL.CONVENTION) or None,  # before WEIGHTS downloads
    _background_class,
    _class_names,
    _gn_groups,
)


def validate_cfg(cfg: CfgNode) -> None:
    """Check every key against ``RULES`` and the keys against each other (``CROSS_RULES``); raise ConfigError
    naming the key. A config that passes carries its values (:func:`check_cfg`)."""
    values = leaves(cfg)
    for key, default in leaves(_C).items():
        rule, value = RULES.get(key, (True, False) if isinstance(default, bool) else None), values[key]
        if rule is not None and not _allows(rule, value, default):
            raise ConfigError(f"{key} must be {_describe(rule, default)}; got "
                              f"{shown(list(value) if isinstance(value, tuple) else value)}")
    for check in CROSS_RULES:
        if problem := check(cfg):
            raise ConfigError(problem)
    cfg.__dict__[_VALIDATED] = repr(values)
