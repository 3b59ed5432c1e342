"""What passes between ``minidet serve``'s HTTP side and a model worker (``worker.worker_main``), over the worker's
pipe, and what a request's waiter in the event loop is handed back (``pool.Job.resolve``).

On the pipe, in order:

- the worker, once: :class:`Ready` (its model is loaded and warmed up, with what the server says of it) or
  :class:`Failed` (one line: why the model could not be loaded; the worker has ended);
- then the server, one at a time: a :class:`Request` (an image's bytes, the file name its record carries, its
  output options), which the worker acknowledges with :class:`Started` before it runs it, then answers with one
  :class:`Answer`; :data:`STOP` (or the pipe's end) ends the worker. A worker that dies before its ``Started``
  never ran the request: the pool hands it to the next worker. One that dies after it may have died of it: the
  request is answered 500, never run again (a request that kills workers does not kill them all).

An :class:`Answer` is :class:`Result` (the JSON record and the seconds of each stage), :class:`ClientError` (the
request's image: 400 or 413) or :class:`ServerError` (500: the model or the serializer failed on it, and the worker
goes on to the next request). The pool hands the waiter a :class:`ServerError` of its own when the worker running a
request died (500) or the server stopped before answering it (503), and :class:`Timeout` when the request waited for
a worker longer than ``--timeout`` and was never run."""

from __future__ import annotations

from dataclasses import dataclass, field

from minidet.apps.outputs.options import OutputOptions

STOP = None  # sent to a worker: end (after the request it is answering)


@dataclass(frozen=True)
class Ready:
    """The worker's model is loaded and warmed up: ``facts`` (family, runtime, class names and classes, weights and
    classes summaries, config, ``max_pixels``, warm-up seconds, threads: ``worker.load``)."""

    facts: dict


@dataclass(frozen=True)
class Failed:
    """The worker could not load its model: ``line`` says why (one line)."""

    line: str


@dataclass(frozen=True)
class Started:
    """The worker has the request it was sent and runs it now (sent before the request's :class:`Answer`)."""


@dataclass(frozen=True)
class Request:
    """One ``POST /predict``: the image's encoded ``data``, the ``file`` name its record carries ("": none), the
    output ``options`` its query asked for (classes kept, lowest score, mask format and polygon tolerance)."""

    data: bytes
    file: str = ""
    options: OutputOptions = field(default_factory=OutputOptions)


@dataclass(frozen=True)
class Result:
    """The answer: ``body``, the JSON record ``minidet infer`` writes for the image (``outputs.records``), and
    ``times``, the seconds of each stage (decode, the model's, serialize)."""

    body: bytes
    times: dict[str, float]


@dataclass(frozen=True)
class ClientError:
    """The request's own fault, in one line: 413 for an image over ``INPUT.MAX_PIXELS``, 400 for bytes that do not
    decode or an image the model refuses."""

    status: int
    line: str


@dataclass(frozen=True)
class ServerError:
    """A failure that is not the request's, in one line: 500 (the model or the serializer failed on it, or its
    worker died), 503 (the server stopped before a worker answered it)."""

    line: str
    status: int = 500


@dataclass(frozen=True)
class Timeout:
    """The request waited ``waited`` seconds for a worker, longer than ``--timeout``; it was not run."""

    waited: float


Answer = Result | ClientError | ServerError | Timeout  # what a request's waiter is handed
