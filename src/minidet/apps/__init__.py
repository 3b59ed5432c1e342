"""The applications, not the engine (nothing in the engine imports them), the role of torchvision's ``references/``,
in rooms by job: the ``minidet`` command (``cli``) and the programs of one module each at the top (``infer``,
``eval_coco``, ``weights``; ``evaluation``: COCO evaluation; ``compare``: the parity verdict; ``synthetic``: images
of known content); ``bulk/`` (one loop for bulk runs, its engines, ledger and writer: one process, torchrun, Ray),
``outputs/`` (what detections become: records, COCO instances, RLE, drawings, videos, safe files), ``bench/``
(``minidet bench`` and its report), ``export/`` (``minidet export`` and its parity gate); a server's is ``serve/``.
Here: what every program shares (the ``KEY VALUE`` overrides, one ``error:`` line, ``run_app``)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager

import cv2

from ..errors import MinidetError
from ..imageio import native_messages
from ..memory import keep_freed_memory

_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")  # a config key: MODEL.ROI_HEADS.SCORE_THRESH


def _is_key(item: str) -> bool:
    return bool(_KEY_RE.match(item)) and not os.path.exists(item)  # IMG_1.JPG may be a file


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None,
                         lists: tuple[str, ...] = ()) -> argparse.Namespace:
    """``parser.parse_args`` for a program whose last positional, ``opts`` (``nargs=argparse.REMAINDER``), takes the
    ``KEY VALUE`` config overrides as they are (a value such as ``-1e-5`` too). The overrides start at the first
    config key; options among or after them (the last command, edited: ``... MODEL.DEVICE cuda --resume``) are
    parsed as if given before them, and the overrides that a list option (``nargs="+"``, its dest in ``lists``,
    e.g. ``input``) took are given back to ``opts``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    known = parser._option_string_actions  # argparse's table of option strings (--resume, --chunk-size, -h, ...)
    start = next((k for k, item in enumerate(argv) if _is_key(item)), len(argv))
    tail, overrides, moved, i = argv[start:], [], [], 0
    while i < len(tail):
        if tail[i].split("=", 1)[0] not in known:  # a KEY VALUE pair, the value as it is
            overrides += tail[i : i + 2]
            i += 2
            continue
        moved.append(tail[i])  # an option and its values, up to the next option or key
        i += 1
        while i < len(tail) and tail[i].split("=", 1)[0] not in known and not _is_key(tail[i]):
            moved.append(tail[i])
            i += 1
    args = parser.parse_args(argv[:start] + moved + overrides)
    for dest in lists:  # "--input a.jpg MODEL.DEVICE cuda": --input took the overrides; give them back
        items = getattr(args, dest) or []
        k = next((k for k, item in enumerate(items) if k > 0 and _is_key(item)), None)
        if k is not None:
            args.opts = items[k:] + args.opts
            setattr(args, dest, items[:k])
    return args


def fail(message: str, debug: bool) -> int:
    """One ``error:`` line on stderr (and, with ``debug``, the traceback first); returns the exit status 2."""
    if debug:
        traceback.print_exc()
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return 2


FAILURES = (MinidetError, OSError, KeyboardInterrupt)  # what ends a program with one line and no traceback hint


def failure(e: BaseException, debug: bool) -> int:
    """The one ``error:`` line of a program that ``e``, one of :data:`FAILURES`, ended, and its exit status:
    minidet's errors (``errors.MinidetError``: a bad config, checkpoint, input, a runtime that failed) and the file
    system's (``OSError``) say their message (2), Ctrl-C says ``interrupted`` (130)."""
    if isinstance(e, KeyboardInterrupt):
        fail("interrupted", debug)
        return 130
    return fail(str(e), debug)


def run_app(args, folders: Callable[[], AbstractContextManager], body: Callable[[], int]) -> int:
    """An application's ``main`` once its arguments are parsed: freed memory kept (``args.keep_memory``: process-
    wide, the application's choice, never the library's), OpenCV's log and the native libraries' messages quiet
    unless ``args.debug``, ``folders()`` held around ``body()``. minidet's errors, the file system's and Ctrl-C are
    :func:`failure`'s one line, any other exception one line naming its type (2); torch.distributed is shut down."""
    if args.keep_memory:
        keep_freed_memory()
    if not args.debug:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    try:
        with folders(), native_messages(args.debug):
            return body()
    except FAILURES as e:
        return failure(e, args.debug)
    except Exception as e:  # noqa: BLE001 - any other failure: still one line without --debug
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        return fail(f"{type(e).__name__}: {e}{hint}", args.debug)
    finally:
        from minidet.apps.bulk import dist  # torch.distributed: imported here, so that `minidet weights` needs no torch

        dist.shutdown()
