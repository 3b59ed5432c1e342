"""The zoos' published files, one table a family (``torchvision.py``, ``detectron.py``, ``detectron2.py``,
``maskrcnn_benchmark.py``, ``mmdetection.py``): each file's name (the registry's and its shipped config's), the zoo's
own config it was trained with, its URL, digest, size and published AP, written once.

The registry (``Family.weights``) is read from these tables; ``tools/zoo_configs.py`` makes each file's shipped config
(``configs/<name>.yaml``) from its row: from the zoo's own config where minidet reads it (mmdetection's python configs,
detectron2's yaml and LazyConfig files: the ``reference`` extra), with the row's ``keys`` beside; from its ``base``
and ``keys`` where the zoo's configs are not at hand (torchvision, Detectron, maskrcnn-benchmark). Importing this
needs no torch and no extra."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..base import WeightsEntry


@dataclass(frozen=True, eq=False)
class ZooFile:
    """One published checkpoint. ``name``: ``<family>/<config>``, the registry's name of the file and the name of
    its shipped config; ``zoo``: the zoo's own config (its path in the zoo's repository, or the zoo's name of the
    model); ``filename``: the cached file's name (``""``: the URL's last part); ``sha256``/``size``: as the zoo
    publishes them (None: not published); ``box_ap``/``mask_ap``: the published COCO AP (None: none published);
    ``source``: where the URL and AP are published. For the shipped config: ``base``, its ``_BASE_`` where the
    table gives its keys (``""``: the family's Base config nearest to what the zoo's config computes), ``keys``: the
    config keys beside the base's that the zoo's config does not say (or that minidet cannot read from it here),
    ``note``: the comment that says what is particular to the file."""

    name: str
    zoo: str
    url: str
    box_ap: float | None
    mask_ap: float | None
    source: str
    filename: str = ""
    sha256: str | None = None
    size: int | None = None
    base: str = ""
    keys: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def family(self) -> str:
        return self.name.partition("/")[0]

    @property
    def file(self) -> str:
        """The cached file's name: the basename of the config's ``MODEL.WEIGHTS``."""
        return self.filename or self.url.rpartition("/")[2]

    @property
    def weights(self) -> WeightsEntry:
        """The file's registry entry."""
        return WeightsEntry(self.name, self.url, self.file, self.name, self.sha256, self.size, self.box_ap,
                            self.mask_ap, self.source)
