"""Video files through OpenCV: frames decoded in a thread while the model runs, and a drawn video written under
a temporary name with the first codec that works, then read back to check its frame count before it is renamed.

FFmpeg's messages while a video is opened and decoded are captured (``native_call``; they reach stderr as they are
only with a tool's ``--debug``): a video that decodes to its end despite them gets one warning line
(:meth:`VideoReader.warning`), one whose decoding stops before the frame count its container announces (a damaged
file) one line saying how far it got (:meth:`VideoReader.shortfall`). What runs beside the decoder writes to stderr
through :data:`STDERR` (a progress bar), so that it is neither lost in nor taken for FFmpeg's messages."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import secrets
import sys
import threading
from collections.abc import Iterator, Sequence

import cv2
import numpy as np

from minidet.errors import InputError
from minidet.imageio import FD2_LOCK, native_call

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".mov")  # the containers read as videos
CODECS = ("avc1", "mp4v", "MJPG")  # H.264, MPEG-4 part 2, Motion JPEG (the last in .avi)
_PREFETCH = 8  # decoded frames waiting for the model


class VideoError(InputError):
    """A video cannot be read or written; ``str(err)`` is one line naming the file."""


class _Stderr:
    """``sys.stderr`` for the threads beside a video decoder: a write waits while the decoder has fd 2 captured."""

    def write(self, text: str) -> int:
        with FD2_LOCK:
            n = sys.stderr.write(text)
            sys.stderr.flush()
        return n

    def flush(self) -> None:
        with FD2_LOCK:
            sys.stderr.flush()

    def __getattr__(self, name: str):
        return getattr(sys.stderr, name)


STDERR = _Stderr()  # what to give tqdm (``file=``) while a VideoReader is being iterated


def _ffmpeg(said: str) -> str:
    """``; FFmpeg: <what it said>`` without the context addresses (``[h264 @ 0x55d0...]``), or ''."""
    return f"; FFmpeg: {re.sub(r' @ 0x[0-9a-fA-F]+]', ']', said)}" if said else ""


def is_video(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in VIDEO_EXTENSIONS


def _open(path: str) -> cv2.VideoCapture:
    """A capture that decodes on one FFmpeg thread: FFmpeg's frame threads print from their own threads, between
    ``read()`` calls, out of reach of a capture around each call (the decoding runs beside the model anyway)."""
    threads = getattr(cv2, "CAP_PROP_N_THREADS", None)  # OpenCV 4.6 and later
    return cv2.VideoCapture(path) if threads is None else cv2.VideoCapture(path, cv2.CAP_ANY, [threads, 1])


class VideoReader:
    """The frames of ``path`` as HxWx3 uint8 BGR arrays, every ``every``-th from frame 0, with ``fps`` (25 when
    the file does not say), ``size`` (width, height) and ``frames`` (the container's count, 0 if it gives none).
    After iterating: ``decoded`` frames were decoded (all of them, not only every ``every``-th), ``ended`` whether
    decoding reached the end of the stream (rather than the consumer stopping), ``native`` the first message FFmpeg
    gave while decoding ('' if none, or if ``--debug`` showed them)."""

    def __init__(self, path: str, every: int = 1) -> None:
        self.path, self.every = path, every
        cap, said = native_call(_open, path)  # FFmpeg's complaints: in the one line below
        if not cap.isOpened():
            raise VideoError(f"{path}: OpenCV cannot open this video (unreadable, or no decoder for its format)"
                             f"{_ffmpeg(said)}")
        fps = cap.get(cv2.CAP_PROP_FPS)
        self.fps = fps if math.isfinite(fps) and fps > 0 else 25.0
        self.size = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        self.frames = max(0, int(cap.get(cv2.CAP_PROP_FRAME_COUNT)))
        self._cap = cap
        self.decoded, self.ended, self.native = 0, False, ""

    def _read(self) -> tuple[bool, np.ndarray | None]:
        """One frame, FFmpeg's messages meanwhile captured (in the decoder thread)."""
        (ok, frame), said = native_call(self._cap.read)
        self.native = self.native or said
        return ok, frame

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(frame index, frame)``, decoded ``_PREFETCH`` frames ahead in a thread; VideoError when the file
        yields no frame at all."""
        frames: queue.Queue = queue.Queue(maxsize=_PREFETCH)
        stop = threading.Event()

        def decode() -> None:
            try:
                while not stop.is_set():
                    ok, frame = self._read()
                    if not ok:
                        self.ended = True
                        break
                    if self.decoded % self.every == 0:
                        frames.put((self.decoded, frame))
                    self.decoded += 1
            finally:
                frames.put(None)

        thread = threading.Thread(target=decode, daemon=True)
        thread.start()
        seen = 0
        try:
            while (item := frames.get()) is not None:
                seen += 1
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a decoder waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    frames.get(timeout=0.05)
            self.native = self.native or native_call(self._cap.release)[1]  # closing may print too
        if not seen:
            announced = f" (of the {self.frames} its container announces)" if self.frames else ""
            raise VideoError(f"{self.path}: no frame can be decoded{announced}{_ffmpeg(self.native)}")

    def shortfall(self) -> str | None:
        """After iterating to the end: one line (the file, the frames read of those announced, where decoding
        stopped, FFmpeg's first message) when decoding stopped before the container's frame count; else None."""
        if not self.ended or not self.frames or self.decoded >= self.frames:
            return None
        return (f"{self.path}: damaged video: {self.decoded} of its {self.frames} frames read, decoding stopped at "
                f"frame {self.decoded} ({self.decoded / self.fps:.2f} s){_ffmpeg(self.native)}")

    def warning(self) -> str | None:
        """After iterating: one line when FFmpeg complained while decoding but the video was read to its end."""
        if not self.native or self.shortfall() is not None:
            return None
        return f"{self.path}: video decoder warning, all {self.decoded} frames decoded anyway{_ffmpeg(self.native)}"


def count_frames(path: str) -> int:
    """The frames OpenCV decodes from ``path`` (0 when it cannot open it)."""
    cap = cv2.VideoCapture(path)
    n = 0
    while cap.isOpened() and cap.grab():
        n += 1
    cap.release()
    return n


def _extension(codec: str) -> str:
    return ".avi" if codec == "MJPG" else ".mp4"


def working_codec(folder: str, size: tuple[int, int], fps: float, codecs: Sequence[str]) -> str | None:
    """The first of ``codecs`` (FourCC codes) with which OpenCV writes a two-frame video of ``size`` into
    ``folder`` that reads back with two frames; None when none does."""
    def works(codec: str) -> bool:
        probe = os.path.join(folder, f".md-{os.getpid()}-probe.tmp{_extension(codec)}")
        try:
            writer = cv2.VideoWriter(probe, cv2.VideoWriter_fourcc(*codec), fps, size)
            if writer.isOpened():
                frame = np.zeros((size[1], size[0], 3), np.uint8)
                writer.write(frame)
                writer.write(frame)
            writer.release()
            return count_frames(probe) == 2
        except cv2.error:
            return False
        finally:
            if os.path.exists(probe):
                os.remove(probe)

    return next((codec for codec in codecs if native_call(works, codec)[0]), None)


class VideoWriter:
    """A drawn video ``<stem>.mp4`` (``.avi`` for MJPG) written frame by frame under a temporary name; :meth:`close`
    reads it back, checks its frame count and renames it, or removes it and raises VideoError."""

    def __init__(self, stem_path: str, codec: str, fps: float, size: tuple[int, int]) -> None:
        self.path = stem_path + _extension(codec)
        folder = os.path.dirname(self.path)
        self._temp = os.path.join(folder, f".md-{os.getpid()}-{secrets.token_hex(4)}.tmp{_extension(codec)}")
        self._writer, _ = native_call(cv2.VideoWriter, self._temp, cv2.VideoWriter_fourcc(*codec), fps, size)
        self.size, self.written = size, 0
        if not self._writer.isOpened():
            self.abort()
            raise VideoError(f"{self.path}: OpenCV cannot write a {codec} video here")

    def write(self, frame: np.ndarray) -> None:
        if (frame.shape[1], frame.shape[0]) != self.size:
            raise VideoError(f"{self.path}: frame of {frame.shape[1]} x {frame.shape[0]}, the video is "
                             f"{self.size[0]} x {self.size[1]}")
        self._writer.write(frame)
        self.written += 1

    def close(self) -> str:
        """Finish, check and rename; returns the video's path."""
        self._writer.release()
        found = count_frames(self._temp)
        if found != self.written:
            self.abort()
            raise VideoError(f"{self.path}: {self.written} frames written but {found} read back; not kept")
        os.replace(self._temp, self.path)
        return self.path

    def abort(self) -> None:
        self._writer.release()
        if os.path.exists(self._temp):
            os.remove(self._temp)
