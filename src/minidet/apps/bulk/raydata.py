"""Bulk inference on a Ray cluster: :class:`Detect`, the callable class that ``ray.data.Dataset.map_batches`` holds
in each actor of a pool, and ``minidet infer --engine ray``'s engine (:class:`RayEngine`), which runs it over the
inputs.

Detect decodes with minidet's own reader (a file path; a URI such as ``s3://bucket/x.jpg`` through pyarrow's file
systems; or the encoded bytes that ``ray.data.read_binary_files`` gives), never with Ray's ``read_images``, which
decodes to RGB with another library and would change the detections. It runs ``TEST.IMS_PER_BATCH`` images per
forward as ``minidet infer`` does (:func:`minidet.apps.bulk.engines.run_batches`) and returns each image's record as
``minidet infer`` writes it (:func:`minidet.apps.outputs.records.render`); an image that cannot be read or run is a
row with an error, never a failed task.

RayEngine is one of ``minidet infer``'s engines (``engines``): the job (``infer_job.Job``) is the same, with the
same inputs (plus URIs of folders and files), output checks, ledger, resume, writer, per-image files and results
file. The actors return records (and drawings); the driver writes every file, taking the rows in input order, so
its chunks and results file are those of one process, and a fresh run forms the same forwards as one process. Ray
retries the work of an actor that dies; a killed driver leaves its chunks for ``--resume``. The cluster is part of
the set-up: its address is checked first (a TCP connection within seconds, :func:`ray_address`) and it is joined
before the run is recorded, so a cluster that cannot be reached is one error line and leaves no output folder;
without ``--debug`` nothing of Ray's own is printed. Ray is imported only here, only for ``--engine ray`` (``pip
install 'minidet[ray]'``)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import logging
import os
import posixpath
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

import cv2
import numpy as np

import minidet
from minidet.apps.bulk import dist
from minidet.apps.bulk.engines import Forward, run_batches
from minidet.apps.bulk.inputs import find_inputs
from minidet.apps.bulk.loader import ImageFiles
from minidet.apps.outputs.options import OutputOptions
from minidet.apps.outputs.records import keep_classes, render
from minidet.apps.outputs.video import is_video
from minidet.config import ConfigError, load_cfg
from minidet.imageio import (
    IMAGE_EXTENSIONS,
    MAX_BYTES_PER_PIXEL,
    METADATA_BYTES,
    ImageReadError,
    native_call,
    read_image,
    read_image_bytes,
)
from minidet.predictor import classes_of
from minidet.slicing import SlicedPredictor, Slicing

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
BLOCK_ROWS = 256  # at most this many inputs per Ray block (one actor task; what a killed actor redoes)
CONNECT_S = 5.0  # a cluster's head must accept a TCP connection within this many seconds (checked at set-up)
# Ray's attempts to reach the GCS of an existing cluster (each up to about 40 s; its default, 20, is many minutes for
# an address where something that is not Ray listens); read by ray.init, set there unless the environment sets it
GCS_TRIES = ("RAY_gcs_server_port_wait_time_s", "1")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def is_uri(path: str) -> bool:
    """Whether ``path`` is a URI (``scheme://...``: ``s3://``, ``gs://``, ``file://``, ...), not a local path."""
    return bool(_URI_RE.match(path))


def _fetch(uri: str, max_pixels: int) -> bytes:
    """The bytes of the file at ``uri`` (pyarrow's file systems); :class:`ImageReadError` naming it for anything
    that fails, or a file larger than ``max_pixels`` pixels can take (see :mod:`minidet.imageio`)."""
    import pyarrow.fs

    try:
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        with fs.open_input_file(path) as f:
            limit = MAX_BYTES_PER_PIXEL * max_pixels + METADATA_BYTES if max_pixels > 0 else 0
            if limit and f.size() > limit:
                raise ImageReadError(uri, f"file is {f.size()} bytes, more than INPUT.MAX_PIXELS ({max_pixels} pixels) "
                                          "can take; not read")
            return f.read()
    except ImageReadError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow's errors (OSError, ArrowInvalid...): this file's problem
        raise ImageReadError(uri, f"cannot read ({type(e).__name__}: {e})") from None


def find_uri_inputs(uris: Sequence[str], recursive: bool = False
                    ) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """Like :func:`minidet.apps.bulk.inputs.find_inputs` for URIs: a file's URI is kept (its name: the base name); a
    folder's gives its images (with ``recursive`` those of its subfolders too; hidden entries left out) named
    relative to it, sorted, and its other files as skipped ``(uri, extension)``; repeats dropped. FileNotFoundError
    names the first URI that cannot be listed or yields nothing."""
    import pyarrow.fs

    found: list[tuple[str, str]] = []
    skipped: dict[str, list[tuple[str, str]]] = {}
    for uri in uris:
        try:
            fs, root = pyarrow.fs.FileSystem.from_uri(uri)
            info = fs.get_file_info(root)
            if info.type == pyarrow.fs.FileType.File:
                found.append((uri, info.base_name))
                continue
            if info.type != pyarrow.fs.FileType.Directory:
                raise FileNotFoundError(f"no such file or folder: {uri}")
            entries = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=recursive))
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow's errors: one line naming the URI
            raise FileNotFoundError(f"{uri}: cannot list ({type(e).__name__}: {e})") from None
        names = sorted(posixpath.relpath(e.path, root) for e in entries if e.type == pyarrow.fs.FileType.File)
        names = [n for n in names if not any(part.startswith(".") for part in n.split("/"))]
        images = [n for n in names if posixpath.splitext(n)[1].lower() in IMAGE_EXTENSIONS]
        if not images:
            raise FileNotFoundError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in folder: {uri}")
        base = uri.rstrip("/") + "/"
        found.extend((base + n, n) for n in images)
        listed = set(images)
        if other := [(base + n, posixpath.splitext(n)[1].lower()) for n in names if n not in listed]:
            skipped[uri] = other
    unique: dict[str, tuple[str, str]] = {}  # a URI named twice: the first
    for item in found:
        unique.setdefault(item[0], item)
    return list(unique.values()), skipped


def _reader(blobs: dict | None, warnings: dict[str, list[str]]) -> Callable[[str, int], np.ndarray]:
    """``read(path, max_pixels)`` for :class:`ImageFiles`: the encoded bytes ``blobs[path]`` if given, else the URI
    or file ``path``; the decoder's warnings kept in ``warnings[path]``."""
    def read(path: str, max_pixels: int) -> np.ndarray:
        warn = warnings.setdefault(path, []).append
        if blobs is not None:
            return read_image_bytes(blobs[path], path, max_pixels, warn)
        if is_uri(path):
            return read_image_bytes(_fetch(path, max_pixels), path, max_pixels, warn)
        return read_image(path, max_pixels, warn)

    return read


class Detect:
    """A minidet model in a Ray actor, for ``ray.data.Dataset.map_batches``::

        ds.map_batches(Detect, fn_constructor_kwargs={"config_file": CFG, "opts": ["MODEL.WEIGHTS", W]},
                       batch_size=4, compute=ray.data.ActorPoolStrategy(size=8), num_gpus=1)

    Built once per actor from ``config_file`` (a file or a config name) and ``opts`` (``KEY VALUE`` overrides), with
    ``minidet infer``'s output options: ``classes`` (``"person,dog"``), ``no_vis`` (default True: no drawing),
    ``vis_thresh``, ``mask_alpha``, ``no_boxes``, ``no_labels``, ``mask_format``, ``polygon_tolerance`` and
    ``slicing`` (``minidet.slicing.Slicing``'s fields as a dict: sliced inference); or all of them as one
    ``options`` (:class:`~minidet.apps.outputs.options.OutputOptions`: how ``minidet infer --engine ray`` hands its
    own on), which then stands for those keywords.
    ``workdir``: the folder that relative paths (config, weights, images) are relative to; the actor changes into it
    when it exists there.

    A batch has a column ``path`` (file paths or URIs) and may have ``bytes`` (the encoded images; ``path`` then only
    names them, as ``read_binary_files(..., include_paths=True)`` gives) and ``image_id`` (passed through). It is run
    ``TEST.IMS_PER_BATCH`` images per forward. The result has one row per input row, in the same order: ``path``,
    ``record`` (the JSON text of the image's record exactly as ``minidet infer --results`` has it: file, height,
    width, instances with bbox [x, y, w, h], score, category id and name, segmentation; "" for an error),
    ``error`` (one line ``"<path>: <what>"``; "" if none), ``warnings`` (the decoder's, one a line), ``jpg`` (the
    drawing; b"" with ``no_vis``), ``timing`` (on the first row of each forward, the JSON of its seconds: ``n``
    images, ``data``, ``model``, ``stages``, with this ``actor`` and its forward count ``seq``; else "")."""

    def __init__(self, config_file: str, opts: Sequence[str] = (), *, classes: str | None = None,
                 no_vis: bool = True, vis_thresh: float = 0.5, mask_alpha: float = 0.5, no_boxes: bool = False,
                 no_labels: bool = False, mask_format: str = "rle", polygon_tolerance: float = 0.0,
                 slicing: dict | None = None, workdir: str | None = None,
                 options: OutputOptions | None = None) -> None:
        if workdir and os.path.isdir(workdir):
            os.chdir(workdir)
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
        self.predictor = minidet.Predictor(load_cfg(config_file, opts))
        if options is None:  # slicing: minidet.slicing.Slicing's fields (each image run as tiles, merged)
            options = OutputOptions(classes=classes, no_vis=no_vis, vis_thresh=vis_thresh, mask_alpha=mask_alpha,
                                    no_boxes=no_boxes, no_labels=no_labels, mask_format=mask_format,
                                    tolerance=polygon_tolerance, slicing=Slicing(**slicing) if slicing else None)
        if options.slicing is not None:
            self.predictor = SlicedPredictor(self.predictor, options.slicing)
        self.keep = options.keep(self.predictor.class_names)
        self.options = options
        self.actor = f"{socket.gethostname()}:{os.getpid()}"
        self.seq = 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        paths = [str(p) for p in batch["path"]]
        warnings: dict[str, list[str]] = {}
        read = _reader(dict(zip(paths, batch["bytes"])) if "bytes" in batch else None, warnings)
        files = ImageFiles(list(enumerate(paths)), self.predictor.cfg.INPUT.MAX_PIXELS, read=read)
        rows = [{"record": "", "error": "", "jpg": b"", "timing": ""} for _ in paths]
        p = self.predictor
        for forward in run_batches(p, files, p.cfg.TEST.IMS_PER_BATCH, workers=0):
            for k, error in forward.errors:
                rows[k]["error"] = error
            for k, image, out in forward.outputs:
                try:
                    record, jpg = render(paths[k], image, keep_classes(out, self.keep), self.options)
                except Exception as e:  # noqa: BLE001 - this image's problem: a row with an error
                    rows[k]["error"] = " ".join(f"{paths[k]}: {type(e).__name__}: {e}".split())
                    continue
                rows[k].update(record=json.dumps(record), jpg=jpg or b"")
            if forward.timing["n"]:
                first = min(k for k, *_ in forward.outputs + forward.errors)
                rows[first]["timing"] = json.dumps({"actor": self.actor, "seq": self.seq, **forward.timing})
                self.seq += 1
        columns = {"path": paths, **{c: [r[c] for r in rows] for c in ("record", "error", "jpg", "timing")},
                   "warnings": ["\n".join(warnings.get(path, [])) for path in paths]}
        result = {c: np.array(v, dtype=object) for c, v in columns.items()}
        if "image_id" in batch:
            result["image_id"] = np.asarray(batch["image_id"])
        return result


def _import_ray():
    """``ray`` with ``ray.data``; ConfigError naming the extra when it is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401 - the extra installs it
    except ImportError as e:
        raise ConfigError(f"--engine ray needs Ray Data: pip install 'minidet[ray]' ({e})") from None
    return ray


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message, without colour codes (Ray's carry them); its type if it has none."""
    lines = [line.strip() for line in _ANSI_RE.sub("", str(e)).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _cause(e: BaseException) -> str:
    """One line for a Ray error: the exception an actor raised (e.g. a checkpoint it could not load), which is the
    last line of the traceback that Ray's message carries."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and cause is not e:
        return _cause(cause)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT``, ``[IPv6]:PORT`` or ``ray://HOST:PORT``; None for anything else."""
    host, colon, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
        return None
    return host, int(port)


def _no_answer(host: str, port: int, timeout: float = CONNECT_S) -> str | None:
    """Why nothing at ``host:port`` accepts a TCP connection within ``timeout`` seconds (the host unknown, the
    connection refused, no answer), in a few words; None when something does."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        return f"unknown host {host} ({why[:1].lower() + why[1:]})"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return (os.strerror(e.errno) if e.errno else str(e) or type(e).__name__).lower()


def _found_by_ray(address: str) -> str | None:
    """The ``HOST:PORT`` that ray.init connects to for ``address`` (``auto``: ``RAY_ADDRESS``, else the cluster
    ``ray start`` last started on this machine, else a running one Ray finds), by Ray's own rules; None where this
    Ray cannot say. ConnectionError when there is none."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # another Ray: ray.init alone decides (bounded, see GCS_TRIES)
        return None
    try:
        return canonicalize_bootstrap_address(address)
    except ConnectionError:
        raise
    except Exception:  # noqa: BLE001 - not Ray's answer to this question: ray.init alone decides
        return None


def ray_address(option: str | None) -> tuple[str, str]:
    """What ``ray.init`` is given for ``--ray-address option``, and the words naming it in an error, once the
    cluster is known to accept connections: ``local`` (the option absent with ``RAY_ADDRESS`` unset, or ``local``: a
    Ray instance started on this machine for the run, nothing to check); ``auto`` (the cluster Ray finds for it:
    ``RAY_ADDRESS``, else the one ``ray start`` last started on this machine, else one running here); ``HOST:PORT``
    or ``ray://HOST:PORT``; no option with ``RAY_ADDRESS`` set: that, as Ray does. A host that cannot be resolved, a
    port where nothing listens (or nothing answers within :data:`CONNECT_S`), ``auto`` with no cluster running, or
    an address that is none of these is a :class:`ConfigError` naming ``--ray-address``, within seconds."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    address = option if option is not None else env or "local"
    if address == "local":
        return address, "a local Ray instance"
    named = f"--ray-address {option}" if option is not None else f"RAY_ADDRESS {env} (no --ray-address given)"
    target = address
    if address == "auto":
        try:
            target = _found_by_ray(address)
        except ConnectionError:
            raise ConfigError(f"{named}: no Ray cluster is running on this machine; start one (ray start --head) or "
                              "give the head node's address: --ray-address HOST:PORT") from None
        if target is None:
            return address, named
        named += f" (RAY_ADDRESS {env})" if env and option is not None else f" (the cluster found at {target})"
    if (where := _host_port(target)) is None:
        raise ConfigError(f"{named}: not a Ray cluster's address; give HOST:PORT (the head node's, port 6379 unless "
                          "ray start was given another), ray://HOST:PORT, auto or local")
    if why := _no_answer(*where):
        raise ConfigError(f"{named}: cannot reach a Ray cluster there: {why}")
    return address, named


@contextlib.contextmanager
def _environ_default(name: str, value: str) -> Iterator[None]:
    """Within the block, the environment variable ``name`` is ``value`` unless it was set already."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


class _Without:
    """``sys.stdout`` or ``sys.stderr`` without what ``threads`` write to it: those that ray.init starts in the
    driver print the errors the cluster reports (a task retried, an actor that died: ``(raylet) ...`` in colour)
    whatever ``log_to_driver`` says. minidet reports the failures that matter in its own words."""

    def __init__(self, stream, threads: set[threading.Thread]) -> None:
        self.stream, self.threads = stream, threads

    def write(self, text: str) -> int:
        if threading.current_thread() in self.threads:
            return len(text)
        return self.stream.write(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


class RayEngine:
    """``minidet infer --engine ray``: the images run by a pool of ``--actors`` :class:`Detect` actors on the Ray
    cluster at ``--ray-address`` (default: ``RAY_ADDRESS``, else a local Ray instance), their rows taken in input
    order; the driver writes every file (``Job``'s loop, ledger and writer). Inputs may be URIs; videos run with
    ``--engine local`` only. Built before the job's set-up: the address is checked first (one line within
    seconds); the cluster is joined during the set-up (:meth:`load`), left at :meth:`close`."""

    name, videos = "ray", False

    def __init__(self, args: argparse.Namespace) -> None:
        if dist.from_env().distributed:
            raise ConfigError("--engine ray: start it once, not under torchrun (the actors do the work)")
        self.args = args
        self.ray = _import_ray()
        if not args.debug:  # as ray.init sets it: Ray's warnings while it looks for a cluster only with --debug
            logging.getLogger("ray").setLevel(logging.ERROR)
        self.address, self.cluster = ray_address(args.ray_address)  # first: one line within seconds
        self.gpus = 0.0
        self.connected = False
        self.streams: tuple | None = None  # sys.stdout and sys.stderr while Ray's threads are kept off them
        self.rows: Iterator[dict] | None = None

    def find_inputs(self, args: argparse.Namespace) -> tuple[list[tuple[str, str]], dict]:
        """:func:`find_inputs` for paths, globs and lists; :func:`find_uri_inputs` for URIs."""
        local = [p for p in args.input if not is_uri(p)]
        found, skipped = find_inputs(local, args.recursive, args.input_list, videos=True) if (
            local or args.input_list) else ([], {})
        more, gone = find_uri_inputs([p for p in args.input if is_uri(p)], args.recursive)
        return found + more, {**skipped, **gone}

    def load(self, job, cfg, weights: str | None) -> None:
        """No model here: each actor loads it. Checks the GPUs asked for against ``MODEL.DEVICE``; reads the classes
        from the checkpoint (the job's); joins the cluster when there are images to run."""
        cuda = cfg.MODEL.DEVICE.startswith("cuda")
        asked = self.args.gpus_per_actor
        self.gpus = asked if asked is not None else (1.0 if cuda else 0.0)
        if cuda != (self.gpus > 0):
            raise ConfigError(f"--gpus-per-actor {self.gpus:g} with MODEL.DEVICE {cfg.MODEL.DEVICE}: "
                              + ("give the actors a GPU" if cuda else "add MODEL.DEVICE cuda to run on the GPUs"))
        classes, summary = classes_of(cfg, weights)  # from the checkpoint alone, for the results file
        if summary:
            print(f"infer: {summary}")
        job.use_classes(classes)
        if any(not is_video(path) for _, path in job.share.todo):
            self._connect()  # set-up: a cluster that cannot be joined fails the run before it writes anything
        return None

    def forwards(self, job, images: list[tuple[int, str]]) -> Iterator[Forward]:
        """Each row the actors return, in input order, as a forward of its own (a repeat, from a block that Ray ran
        again, is dropped): its record and drawing as the actor made them, its error, its decoder's warnings, and,
        on an actor forward's first row, that forward's timing (the actor as its rank)."""
        actors: dict[str, int] = {}  # actor -> its number in the timing records
        last = 0
        self.rows = self._rows(images, job.cfg.TEST.IMS_PER_BATCH)
        for row in self.rows:
            image_id = int(row["image_id"])
            if image_id <= last:  # rows come in input order; a repeat is dropped
                continue
            last = image_id
            forward = Forward(warnings=list(filter(None, row["warnings"].split("\n"))))
            if row["timing"]:
                t = json.loads(row["timing"])
                forward.timing = {"rank": actors.setdefault(t.pop("actor"), len(actors)), **t}
            if row["error"]:
                forward.errors.append((image_id, row["error"]))
            else:
                made = (json.loads(row["record"]), row["jpg"] or None)
                forward.outputs.append((image_id, lambda made=made: made))
            yield forward

    def close(self) -> None:
        """The rows' iterator ended before Ray is (:meth:`_disconnect`)."""
        try:
            if self.rows is not None:
                self.rows.close()  # Ray Data's iterator ends before Ray does
        finally:
            self._disconnect()

    def _connect(self) -> None:
        """``ray.init`` for the cluster found at set-up, with Ray Data's settings for the run. Without ``--debug``
        Ray's own messages are not shown: its log level, its native code while it starts, the threads it starts
        (:class:`_Without`), the colour reset it writes to a terminal at exit (:meth:`_disconnect`). Its wait for
        the GCS of an existing cluster is bounded (:data:`GCS_TRIES`); a failure is a :class:`ConfigError` naming
        the cluster."""
        ray, args = self.ray, self.args
        local = {"include_dashboard": False} if self.address == "local" else {}
        init = functools.partial(ray.init, address=self.address, log_to_driver=args.debug,
                                 logging_level=logging.INFO if args.debug else logging.ERROR, **local)

        def attempt() -> BaseException | None:  # the error as a value: native_call reruns a call raising OSError
            try:
                init()
            except Exception as e:  # noqa: BLE001 - Ray's errors (ConnectionError, RuntimeError...): one line
                return e
            return None

        before = set(threading.enumerate())
        with _environ_default(*GCS_TRIES) if not local else contextlib.nullcontext():
            if args.debug:
                error = attempt()
            else:  # Ray's own messages only with --debug (its errors reach the driver as exceptions)
                os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
                error, _ = native_call(attempt)  # what its native code says on starting is not shown
        if error is not None:
            with contextlib.suppress(Exception):
                ray.shutdown()
            what = "cannot start" if local else "cannot connect to the Ray cluster"
            raise ConfigError(f"{self.cluster}: {what} ({_first_line(error)})") from None
        self.connected = True
        if not args.debug:
            logging.getLogger("ray.data").setLevel(logging.CRITICAL)  # its errors are raised too
            ours = set(threading.enumerate()) - before
            self.streams = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _Without(sys.stdout, ours), _Without(sys.stderr, ours)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # minidet's bar instead
        ctx.print_on_execution_start = False
        ctx.execution_options.preserve_order = True  # the chunks and results file of one process

    def _disconnect(self) -> None:
        """``ray.shutdown`` once connected; stdout and stderr as they were. Without ``--debug``, the colour reset
        that Ray's copy of colorama (set up while Ray Data runs) would write to a terminal's stdout at exit is
        dropped."""
        if self.connected:
            self.connected = False
            self.ray.shutdown()
        if self.streams is not None:
            colours = sys.modules.get("colorama.initialise")
            if colours is not None and hasattr(colours, "reset_all"):
                atexit.unregister(colours.reset_all)
            if isinstance(sys.stdout, _Without):
                sys.stdout = self.streams[0]
            if isinstance(sys.stderr, _Without):
                sys.stderr = self.streams[1]
            self.streams = None

    def _blocks(self, images: list[tuple[int, str]], batch: int) -> list:
        """The inputs as Arrow tables, one Ray block each: whole forwards (a multiple of ``TEST.IMS_PER_BATCH``
        rows, so that the actors form the forwards one process would), about four per actor, at most
        :data:`BLOCK_ROWS` rows."""
        import pyarrow as pa

        bs = batch
        forwards = -(-len(images) // bs)
        rows = bs * max(1, min(-(-forwards // (4 * self.args.actors)), BLOCK_ROWS // bs))
        blocks = [images[k : k + rows] for k in range(0, len(images), rows)]
        return [pa.table({"image_id": [i for i, _ in b], "path": [p for _, p in b]}) for b in blocks]

    def _rows(self, images: list[tuple[int, str]], batch: int) -> Iterator[dict]:
        """Run ``images`` through the actor pool on the cluster joined at set-up; yield the result rows in input
        order."""
        if not images:
            return
        ray, args = self.ray, self.args
        print(f"infer: ray: {args.actors} actor{'s' if args.actors > 1 else ''} with {self.gpus:g} GPU each, "
              f"cluster {self.address}", flush=True)
        opts = [*args.opts, *(["MODEL.DEVICE", "cuda"] if self.gpus else [])]  # the GPU Ray gives the actor
        # two tasks queued per actor: the next block is there when one ends, and the first actor to start does not
        # take the blocks of those still starting
        pool = ray.data.ActorPoolStrategy(size=args.actors, max_tasks_in_flight_per_actor=2)
        ds = ray.data.from_arrow(self._blocks(images, batch)).map_batches(
            Detect, batch_size=batch, compute=pool,
            num_gpus=self.gpus or None,  # an actor that dies is restarted, its task rerun (Ray Data's default)
            fn_constructor_kwargs={"config_file": args.config_file, "opts": opts, "workdir": os.getcwd(),
                                   "options": args.options})
        try:
            yield from ds.iter_rows()
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"the Ray job failed: {_cause(e)}") from None
