"""The pre-trained weights registry: every weight family's published checkpoints (``Family.weights``) by name, and
the licence each zoo states for its weights (:data:`ZOO_LICENCES`, :func:`licence_of`), and what each file is
(:func:`family_of`; :func:`traits`: its architecture and dataset, from its config)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import MinidetError
from ..families import FAMILIES, FAMILY_OF, NOT_STATED, REGISTRY, WeightsEntry, entry_for  # noqa: F401 (its API)
from ..families.architectures import ARCHITECTURES as TABLE
from ..families.architectures import Architecture, turned_on


def family_of(entry: WeightsEntry) -> str | None:
    """The family (zoo) of a registry ``entry``; None for an entry of no family."""
    return FAMILY_OF.get(entry.name)


@dataclass(frozen=True)
class ZooLicence:
    """The licence a zoo states for its published weights, as its family gives it (``Family.title``, ``licence``,
    ``licence_source``): ``licence`` as the zoo names it (``NOT_STATED`` where it says nothing of its weights'
    licence; the licence of its code is another matter); ``source``: the file and repository that say so (or that say
    nothing). weights/README.md says what each zoo says, in our words."""

    zoo: str  # the zoo's own name, for messages
    licence: str
    source: str


# by family name (the zoo of its registry entries)
ZOO_LICENCES: dict[str, ZooLicence] = {
    f.name: ZooLicence(f.title, f.licence, f.licence_source) for f in FAMILIES.values() if f.weights
}


def licence_of(entry: WeightsEntry) -> ZooLicence | None:
    """The licence the zoo of registry ``entry`` states for its weights; None for an entry of no family."""
    zoo = family_of(entry)
    return ZOO_LICENCES.get(zoo) if zoo is not None else None


def licence_line(entry: WeightsEntry) -> str | None:
    """What a download of ``entry`` says of its licence (one line), or None for an entry of no family."""
    z = licence_of(entry)
    if z is None:
        return None
    if z.licence == NOT_STATED:
        return f"licence of these weights: not stated by {z.zoo} ({z.source}); see weights/README.md"
    return f"licence of these weights: {z.licence}, as {z.zoo} states it ({z.source})"


def close_hint(text: str) -> str:
    """``; close names: a, b (`minidet weights list` lists them)``: the registry names near a mistyped ``text``, as
    ``--config-file`` gives the config names near a mistyped one (``config.close_names``)."""
    from ..config import close_names  # noqa: PLC0415 (the config module reads images: not for `weights list`)

    close = close_names(text, list(REGISTRY))
    return f"{'; close names: ' + ', '.join(close) if close else ''} (`minidet weights list` lists them)"


# ----------------------------------------------------------------------------------------------------------------
# what a registry file is, from its config: `minidet weights list --family/--arch/--dataset`

PLAIN = "plain"  # the architecture of a file none of ARCHITECTURES describes: Mask R-CNN with a ResNet body
# what a config may turn on beyond the plain Mask R-CNN (a file may have several: cascade+dcn), by the name `minidet
# weights list --arch` gives it: the architecture table's entries with a tag (families/architectures.py)
ARCHITECTURES: dict[str, Architecture] = dict(sorted((a.tag, a) for a in TABLE if a.tag))
# the dataset a file was trained on, by the classes its config counts (without the background)
DATASETS: dict[int, str] = {80: "coco", 90: "coco", 1230: "lvis-v0.5", 1203: "lvis-v1", 8: "cityscapes"}


@dataclass(frozen=True)
class Traits:
    """What a registry file is beside its family (:func:`family_of`): its ``architectures`` (``ARCHITECTURES``
    names, or ``(PLAIN,)``) and its ``dataset`` (a ``DATASETS`` name)."""

    architectures: tuple[str, ...]
    dataset: str


@functools.cache
def traits(name: str) -> Traits:
    """The :class:`Traits` of the registry file ``name``, read from its config (``entry.config``; ``?`` for an entry
    whose config is not shipped: one added by a program)."""
    from ..config import get_cfg  # noqa: PLC0415 (the config module reads images: not for a plain `weights list`)

    try:
        cfg = get_cfg(REGISTRY[name].config)
    except MinidetError:
        return Traits(("?",), "?")
    on = turned_on(cfg, get_cfg())
    archs = tuple(tag for tag, a in ARCHITECTURES.items() if a in on) or (PLAIN,)
    m = cfg.MODEL
    classes = m.ROI_HEADS.NUM_CLASSES - (0 if FAMILIES[m.CONVENTION].background_last else 1)
    return Traits(archs, DATASETS.get(classes, f"{classes} classes"))
