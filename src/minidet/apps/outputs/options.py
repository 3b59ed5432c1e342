"""What a run's outputs are made of, in one frozen record (:class:`OutputOptions`): the classes kept, the lowest
score, the drawing (on or off, and how), the masks' format and the polygons' tolerance, the slicing. ``minidet
infer`` (its local, torchrun and Ray engines), ``minidet eval`` and the server's workers all read them from here:
:func:`from_args` builds them once from a program's arguments, ``serve.app.parse_options`` from a request's query.

Torch-free (``minidet.slicing`` is imported only when ``--slice`` asks for it), so that the ranges
(:data:`MASK_FORMATS`, :data:`MAX_TOLERANCE`) and the ``--classes`` reader (:func:`parse_classes`) cost nothing to
import."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minidet.categories import BACKGROUND, UNUSED
from minidet.errors import ConfigError

if TYPE_CHECKING:
    from minidet.slicing import Slicing

MASK_FORMATS = ("rle", "polygon", "none")  # COCO RLE of the frame, COCO polygons (outlines, holes filled), none
MAX_TOLERANCE = 10_000.0  # pixels: past any outline's size (OpenCV refuses a simplification from 1e30 up)
# Slicing's fields as the options that set them
_SLICE_OPTION = {"size": "--slice", "overlap": "--overlap", "merge": "--merge", "match": "--match",
                 "threshold": "--match-thresh", "max_tiles": "--max-tiles"}


@dataclass(frozen=True)
class OutputOptions:
    """How one run (or one server request) turns detections into outputs.

    - ``classes``: the class names to keep, comma-separated, as given (``--classes``, ``classes=``; None: all);
      :meth:`keep` reads them against a model's names.
    - ``score_thresh``: the lowest score kept (0: all; the server's ``score_thresh=``).
    - ``no_vis``: no drawing; else drawn with ``vis_thresh`` (the lowest score drawn), ``mask_alpha`` (the masks'
      opacity), boxes unless ``no_boxes``, class labels unless ``no_labels``.
    - ``mask_format``: the masks in the records, one of :data:`MASK_FORMATS`; ``tolerance``: how far polygons are
      simplified, in pixels (``--polygon-tolerance``, ``tolerance=``; 0: exact pixel edges).
    - ``slicing``: sliced inference (``minidet.slicing.Slicing``; None: each image run whole).

    Nothing is checked here (a value out of range fails where it is used): :func:`from_args` and the server's query
    reader check what a user gives."""

    classes: str | None = None
    score_thresh: float = 0.0
    no_vis: bool = False
    vis_thresh: float = 0.5
    mask_alpha: float = 0.5
    no_boxes: bool = False
    no_labels: bool = False
    mask_format: str = "rle"
    tolerance: float = 0.0
    slicing: Slicing | None = None

    def keep(self, names: Sequence[str]) -> set[int] | None:
        """The class indices of :attr:`classes` among a model's class ``names`` (None: all); ConfigError for a name
        the model lacks."""
        return parse_classes(self.classes, list(names))


def parse_classes(text: str | None, names: list[str], option: str = "--classes") -> set[int] | None:
    """The class indices ``text`` names (any case), None for all; ConfigError for a name the model lacks, or for no
    name, its line beginning with the ``option`` that gave the text (``--classes``, the server's ``classes``)."""
    if text is None:
        return None
    real = [(k, n) for k, n in enumerate(names) if n not in (BACKGROUND, UNUSED)]
    lower = {n.lower(): k for k, n in real}
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w.lower() not in lower]
    if unknown or not wanted:
        listed = ", ".join(n for _, n in real)
        raise ConfigError(f"{option}: {'no class given' if not wanted else 'unknown class ' + repr(unknown[0])} "
                          f"(the model's classes: {listed})")
    return {lower[w.lower()] for w in wanted}


def slicing_of(args: argparse.Namespace, p: argparse.ArgumentParser | None = None) -> Slicing | None:
    """The ``Slicing`` the ``--slice`` options ask for (None without ``--slice``); a bad value, or an option of
    slicing given without ``--slice`` (``slice_options``: those given), is ``p.error``'s one line (without ``p``:
    the ValueError)."""
    if getattr(args, "slice", None) is None:  # eval's arguments have no --slice
        if given := getattr(args, "slice_options", None):
            _refuse(p, f"{given[0]} applies to sliced inference only: give --slice S too, or leave it out")
        return None
    from minidet.slicing import Slicing

    try:
        return Slicing(args.slice, args.overlap, args.merge, args.match, args.match_thresh, args.full_pass,
                       args.max_tiles)
    except ValueError as e:
        if p is None:
            raise
        field, _, what = str(e).partition(" ")  # Slicing names the field first: say the option instead
        p.error(f"{_SLICE_OPTION.get(field, field)} {what}")


def _refuse(p: argparse.ArgumentParser | None, line: str) -> None:
    """``p.error(line)`` (the usage and one ``error:`` line, exit status 2); without ``p``: ValueError."""
    if p is None:
        raise ValueError(line)
    p.error(line)


def from_args(args: argparse.Namespace, p: argparse.ArgumentParser | None = None) -> OutputOptions:
    """The output options of a program's arguments (infer's; eval's, which have ``--mask-format`` alone: the others
    keep their defaults), checked: a value out of its range, or an option that does nothing with the others (a
    polygon tolerance without polygons, a slicing option without ``--slice``), is ``p.error``'s one line (without
    ``p``: ValueError)."""
    slicing = slicing_of(args, p)
    given = {name: getattr(args, name) for name in ("classes", "no_vis", "vis_thresh", "mask_alpha", "no_boxes",
                                                      "no_labels", "mask_format") if hasattr(args, name)}
    options = OutputOptions(**given, tolerance=getattr(args, "polygon_tolerance", 0.0), slicing=slicing)
    if not 0 <= options.tolerance <= MAX_TOLERANCE:
        _refuse(p, f"--polygon-tolerance must be a number of pixels from 0 to {MAX_TOLERANCE:g}, "
                   f"got {options.tolerance:g}")
    if options.tolerance > 0 and options.mask_format != "polygon":
        _refuse(p, f"--polygon-tolerance simplifies polygons: give --mask-format polygon too (the masks are "
                   f"{options.mask_format})")
    for flag, value in (("--vis-thresh", options.vis_thresh), ("--mask-alpha", options.mask_alpha)):
        if not 0.0 <= value <= 1.0:
            _refuse(p, f"{flag} must be between 0 and 1")
    return options
