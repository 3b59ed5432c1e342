"""The pre-trained weights registry: every weight family's published checkpoints (``Family.weights``) by name, and
the licence each zoo states for its weights (:data:`ZOO_LICENCES`, :func:`licence_of`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..families import FAMILIES, WeightsEntry

# every family's published weights, by name
REGISTRY: dict[str, WeightsEntry] = {e.name: e for f in FAMILIES.values() for e in f.weights}
# the family (zoo) of each registry name
_ZOO_OF: dict[str, str] = {e.name: f.name for f in FAMILIES.values() for e in f.weights}

NOT_STATED = "not stated"


@dataclass(frozen=True)
class ZooLicence:
    """The licence a zoo states for its published weights: ``licence`` as the zoo names it (``NOT_STATED`` where
    it says nothing of its weights' licence; the licence of its code is another matter); ``source``: the file and
    repository that say so (or that say nothing). weights/README.md says what each zoo says, in our words."""

    zoo: str  # the zoo's own name, for messages
    licence: str
    source: str


# by family name (the zoo of its registry entries)
ZOO_LICENCES: dict[str, ZooLicence] = {
    "torchvision": ZooLicence("torchvision", NOT_STATED, "README.md of pytorch/vision"),
    "detectron": ZooLicence("Detectron", "CC BY-SA 3.0", "MODEL_ZOO.md of facebookresearch/Detectron"),
    "detectron2": ZooLicence("detectron2", "CC BY-SA 3.0", "MODEL_ZOO.md of facebookresearch/detectron2"),
    "maskrcnn_benchmark": ZooLicence("maskrcnn-benchmark", NOT_STATED,
                                     "MODEL_ZOO.md of facebookresearch/maskrcnn-benchmark"),
    "mmdetection": ZooLicence("mmdetection", NOT_STATED, "configs/mask_rcnn/README.md of open-mmlab/mmdetection"),
}


def family_mismatch(weights: str, convention: str) -> str | None:
    """Why ``MODEL.WEIGHTS weights`` (a registry name, or a registry file's URL) cannot run under ``MODEL.CONVENTION
    convention``: one line naming both families and the config that runs the file (said before anything is
    downloaded; the loader would refuse the file after its download); None for any other value. A file's family
    fixes the config's family, whatever classes it was fine-tuned on."""
    entry = entry_for(str(weights))
    family = _ZOO_OF.get(entry.name) if entry is not None else None
    if family is None or family == convention:
        return None
    return (f"MODEL.WEIGHTS {str(weights).strip()} is a {family} checkpoint but the config is of the {convention} "
            f"family (MODEL.CONVENTION {convention}); the config that runs it: --config-file {entry.config} (nothing "
            "was downloaded)")


def licence_of(entry: WeightsEntry) -> ZooLicence | None:
    """The licence the zoo of registry ``entry`` states for its weights; None for an entry of no family."""
    zoo = _ZOO_OF.get(entry.name)
    return ZOO_LICENCES.get(zoo) if zoo is not None else None


def licence_line(entry: WeightsEntry) -> str | None:
    """What a download of ``entry`` says of its licence (one line), or None for an entry of no family."""
    z = licence_of(entry)
    if z is None:
        return None
    if z.licence == NOT_STATED:
        return f"licence of these weights: not stated by {z.zoo} ({z.source}); see weights/README.md"
    return f"licence of these weights: {z.licence}, as {z.zoo} states it ({z.source})"


def entry_for(value: str) -> WeightsEntry | None:
    """The registry entry named ``value``, or whose URL is ``value``; None if neither."""
    value = value.strip()
    if value in REGISTRY:
        return REGISTRY[value]
    return next((e for e in REGISTRY.values() if e.url == value), None)


def close_hint(text: str) -> str:
    """``; close names: a, b (`minidet weights list` lists them)``: the registry names near a mistyped ``text``, as
    ``--config-file`` gives the config names near a mistyped one (``config.close_names``)."""
    from ..config import close_names  # noqa: PLC0415 (the config module reads images: not for `weights list`)

    close = close_names(text, list(REGISTRY))
    return f"{'; close names: ' + ', '.join(close) if close else ''} (`minidet weights list` lists them)"
