"""The applications, not the engine: the ``minidet`` command (``cli``) and the programs that it and ``tools/`` run
(``infer``: images and videos; ``eval_coco``: COCO AP and timing; ``benchmark``: against torchvision; ``weights``:
the registry and cache), with what only they use: input listing (``inputs``), loader workers (``data``), sharding
(``dist``), resumable chunks (``chunks``), safe outputs (``fileio``), COCO evaluation (``evaluation``, ``rle``),
bulk runs (``bulk``) and on a Ray cluster (``raydata``), video (``video``) and drawing (``vis``); the role of
torchvision's ``references/``. Built on the engine; nothing in the engine imports them."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager

import cv2

from ..imageio import native_messages
from ..memory import keep_freed_memory
from . import dist


def fail(message: str, debug: bool) -> int:
    """One ``error:`` line on stderr (and, with ``debug``, the traceback first); returns the exit status 2."""
    if debug:
        traceback.print_exc()
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def run_app(args, errors: tuple[type[BaseException], ...], folders: Callable[[], AbstractContextManager],
            body: Callable[[], int]) -> int:
    """An application's ``main`` once its arguments are parsed: freed memory kept (``args.keep_memory``: process-
    wide, the application's choice, never the library's), OpenCV's log and the native libraries' messages quiet
    unless ``args.debug``, ``folders()`` held around ``body()``. A failure in ``errors`` is one line (status 2),
    Ctrl-C one line (130), any other exception one line naming its type (2); torch.distributed is shut down."""
    if args.keep_memory:
        keep_freed_memory()
    if not args.debug:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    try:
        with folders(), native_messages(args.debug):
            return body()
    except errors as e:
        return fail(str(e), args.debug)
    except KeyboardInterrupt:
        fail("interrupted", args.debug)
        return 130
    except Exception as e:  # noqa: BLE001 - any other failure: still one line without --debug
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        return fail(f"{type(e).__name__}: {e}{hint}", args.debug)
    finally:
        dist.shutdown()
