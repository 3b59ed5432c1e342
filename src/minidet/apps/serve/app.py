"""The HTTP side of ``minidet serve``: a Starlette application (:func:`build_app`) in front of the worker pool.

- ``POST /predict``: the image's bytes as the body (``Content-Type: image/*``) or a multipart form's ``image`` field;
  the answer is the JSON record ``minidet infer`` writes for that image (``outputs.records``), with the time of each
  stage in a ``Server-Timing`` header. Query: ``classes`` (names, comma-separated), ``score_thresh`` (the lowest
  score returned), ``mask_format`` (``rle``, ``polygon`` or ``none``), ``tolerance`` (polygons simplified by up to
  this many pixels), ``file`` (the name the record carries).
- ``GET /health/live``, ``GET /health/ready`` (and the Open Inference Protocol's ``/v2/health/live|ready``),
  ``GET /metrics`` (Prometheus text), ``GET /v2`` and ``GET /v2/models/<name>`` (metadata: family, classes, config,
  weights SHA-256), ``GET /v2/models/<name>/ready``; ``GET /``: a page to try it in a browser.

Every refusal is a JSON ``{"error": "<one line>"}`` with its status, answered before any model sees the request:
401 (a token is set and the request lacks it), 415 (neither ``image/*`` nor a multipart form), 413 (a body over
``--max-body-mb``, or an image whose header shows more than ``INPUT.MAX_PIXELS`` pixels), 400 (an empty body, bytes
of no known image format or that do not decode, a bad query), 429 with ``Retry-After`` (the queue is full), 503 (the
model is loading, or the request waited past ``--timeout``); 500 when the model failed on it or its worker died."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import math
import time
from dataclasses import dataclass
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from minidet import __version__
from minidet.apps.outputs.instances import MASK_FORMATS
from minidet.apps.outputs.records import parse_classes
from minidet.apps.serve.metrics import Metrics
from minidet.apps.serve.pool import Job, Pool, QueueFull
from minidet.apps.serve.worker import Options
from minidet.errors import ConfigError
from minidet.imageio import ImageReadError, check_image_bytes


@dataclass
class Settings:
    """The server's choices: the model's ``name`` (``/v2/models/<name>``), the bearer ``token`` (None: none),
    the largest body in bytes, ``timeout`` (seconds a request may wait for a worker; 0: no limit), the weights'
    file and SHA-256 (None: random weights), the config file."""

    name: str
    token: str | None
    max_bytes: int
    timeout: float
    weights: str | None
    weights_sha256: str | None
    config_file: str


def error(status: int, line: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(line).split())}, status_code=status, headers=headers)


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The request's body, or None as soon as it is longer than ``limit`` bytes."""
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def form_image(request: Request, body: bytes) -> tuple[bytes, str]:
    """The ``image`` field of a multipart form already read as ``body``: its bytes and file name."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async with Request(request.scope, replay).form(max_files=1, max_fields=16, max_part_size=len(body) + 1) as form:
        field = form.get("image")
        if field is None or isinstance(field, str):
            raise HTTPException(400, "a multipart form needs a file field named 'image'")
        return await field.read(), field.filename or ""


def parse_options(request: Request, class_names: list[str]) -> Options:
    """The query's options (:class:`~minidet.apps.serve.worker.Options`); HTTPException 400 naming a bad one."""
    q = request.query_params
    try:
        keep = parse_classes(q.get("classes"), class_names) if q.get("classes") is not None else None
    except ConfigError as e:
        raise HTTPException(400, str(e).replace("--classes", "classes")) from None
    try:
        thresh = float(q.get("score_thresh", 0))
    except ValueError:
        thresh = math.nan
    if not 0 <= thresh <= 1:
        raise HTTPException(400, f"score_thresh: a number from 0 to 1, got {q.get('score_thresh')!r}")
    mask_format = q.get("mask_format", "rle")
    if mask_format not in MASK_FORMATS:
        raise HTTPException(400, f"mask_format: one of {', '.join(MASK_FORMATS)}, got {mask_format!r}")
    try:
        tolerance = float(q.get("tolerance", 0))
    except ValueError:
        tolerance = math.nan
    if not 0 <= tolerance < math.inf:
        raise HTTPException(400, f"tolerance: a number of pixels of at least 0, got {q.get('tolerance')!r}")
    return Options(file=q.get("file", ""), keep=keep, score_thresh=thresh, mask_format=mask_format,
                   tolerance=tolerance)


def server_timing(times: dict[str, float]) -> str:
    """An HTTP ``Server-Timing`` value: each stage's milliseconds."""
    return ", ".join(f"{k.replace(' ', '_')};dur={v * 1000:.3f}" for k, v in times.items())


def build_app(pool: Pool, settings: Settings, metrics: Metrics | None = None) -> Starlette:
    """The application; its lifespan starts the pool's workers and, at shutdown (after the requests in flight are
    answered), stops them."""
    metrics = metrics or Metrics(pool)
    page = resources.files("minidet.apps.serve").joinpath("page.html").read_text()

    def authorized(request: Request) -> bool:
        if settings.token is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), settings.token.encode())

    def answered(response: Response, endpoint: str = "/predict") -> Response:
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    async def predict(request: Request) -> Response:
        t0 = time.monotonic()
        response = await _predict(request)
        metrics.latency.labels(str(response.status_code)).observe(time.monotonic() - t0)
        if response.status_code == 200:
            metrics.bytes_out.inc(len(response.body))
        return answered(response)

    async def _predict(request: Request) -> Response:
        if not pool.ready:
            if pool.facts is None:
                return error(503, "the model is loading; retry when /health/ready answers 200", {"Retry-After": "1"})
            return error(503, "no worker is up (one is being replaced); retry shortly", {"Retry-After": "1"})
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not (ctype.startswith("image/") or ctype == "multipart/form-data"):
            return error(415, f"Content-Type {ctype or '(none)'}: send the image's bytes as image/* (image/jpeg, "
                         "image/png, ...) or a multipart/form-data form with a file field named 'image'")
        length = request.headers.get("content-length", "")
        limit = f"the body is larger than the server's limit of {settings.max_bytes} bytes (--max-body-mb)"
        if length.isdigit() and int(length) > settings.max_bytes:
            return error(413, limit)
        try:
            options = parse_options(request, pool.facts["class_names"])
            body = await read_capped(request, settings.max_bytes)
            if body is None:
                return error(413, limit)
            data = body
            if ctype == "multipart/form-data":
                data, filename = await form_image(request, body)
                options.file = request.query_params.get("file", filename)
        except HTTPException as e:
            return error(e.status_code, e.detail)
        name = options.file or "image"
        if not data:
            return error(400, f"{name}: empty body (0 bytes): send the image's encoded bytes")
        try:
            check_image_bytes(data, name, pool.facts["max_pixels"])
        except ImageReadError as e:
            return error(413 if e.too_large else 400, str(e))
        loop = asyncio.get_running_loop()
        job = Job(data, options, loop, loop.create_future())
        try:
            pool.submit(job)
        except QueueFull:
            metrics.rejections.labels("queue_full").inc()
            retry = max(1, math.ceil(pool.max_queue * typical_seconds() / max(1, pool.ready_workers)))
            return error(429, f"the server is busy: {pool.max_queue} requests wait already (--max-queue); "
                         f"retry in {retry} s", {"Retry-After": str(retry)})
        if settings.timeout:
            done, _ = await asyncio.wait({job.future}, timeout=settings.timeout)
            if not done and job.drop():
                pool.release(job)
                job.future.cancel()
                return timed_out(time.monotonic() - job.queued)
        result = await job.future
        if result[0] == "timeout":
            return timed_out(result[1])
        kind, payload, *rest = result
        times = rest[-1] if rest else {}
        if kind == "ok":
            metrics.observe_times(times)
            observed.append(sum(v for k, v in times.items() if k != "serialize"))
            del observed[:-50]
            metrics.queue_wait.observe(job.waited)
            headers = {"Server-Timing": server_timing({"queue": job.waited, **times})}
            return Response(payload, media_type="application/json", headers=headers)
        status, line = payload, rest[0]
        return error(status, line)

    observed: list[float] = []  # the last requests' model seconds, for Retry-After

    def typical_seconds() -> float:
        return sorted(observed)[len(observed) // 2] if observed else 1.0

    def timed_out(waited: float) -> Response:
        metrics.rejections.labels("timeout").inc()
        return error(503, f"the request waited {waited:.1f} s for a worker, longer than the server's --timeout of "
                     f"{settings.timeout:g} s; it was not run", {"Retry-After": "1"})

    async def live(request: Request) -> Response:
        return answered(JSONResponse({"live": True}), request.url.path)

    async def ready(request: Request) -> Response:
        body = {"ready": pool.ready, "workers_ready": pool.ready_workers, "workers": pool.n}
        return answered(JSONResponse(body, status_code=200 if pool.ready else 503), request.url.path)

    async def metrics_text(request: Request) -> Response:
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def server_meta(request: Request) -> Response:
        return JSONResponse({"name": "minidet", "version": __version__, "extensions": ["minidet_predict"],
                             "models": [settings.name]})

    def model_or_404(request: Request) -> None:
        if request.path_params["name"] != settings.name:
            raise HTTPException(404, f"no model {request.path_params['name']!r}; this server has {settings.name!r}")

    async def model_meta(request: Request) -> Response:
        model_or_404(request)
        facts = pool.facts or {}
        return JSONResponse({
            "name": settings.name, "versions": [], "platform": "minidet",
            "inputs": [{"name": "image", "datatype": "BYTES", "shape": [1]}],
            "outputs": [{"name": "instances", "datatype": "BYTES", "shape": [-1]}],
            "ready": pool.ready, "family": facts.get("family"), "runtime": facts.get("runtime"),
            "classes": facts.get("classes"), "weights": {"file": settings.weights, "sha256": settings.weights_sha256,
                                                        "summary": facts.get("weights_summary")},
            "config_file": settings.config_file, "config": facts.get("config"),
            "workers": pool.n, "threads_per_worker": facts.get("threads")})

    async def model_ready(request: Request) -> Response:
        model_or_404(request)
        return JSONResponse({"name": settings.name, "ready": pool.ready}, status_code=200 if pool.ready else 503)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = (f"no endpoint {request.url.path}: POST /predict, GET / (a page to try it), /health/live, "
                      "/health/ready, /metrics, /v2, /v2/models/<name>")
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return error(exc.status_code, detail, getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:
        return error(500, f"{type(exc).__name__}: {exc}")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        pool.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, pool.close)

    def guarded(handler):
        """``handler`` behind the token (when one is set): 401 without it, and nothing else runs."""
        async def check(request: Request) -> Response:
            if not authorized(request):
                response = error(401, "this server needs its token: send the header 'Authorization: Bearer <token>'",
                                 {"WWW-Authenticate": "Bearer"})
                return answered(response, request.url.path if request.url.path == "/predict" else "other")
            return await handler(request)
        return check

    routes = [
        Route("/", index), Route("/predict", guarded(predict), methods=["POST"]),
        Route("/health/live", live), Route("/health/ready", ready),
        Route("/v2/health/live", live), Route("/v2/health/ready", ready),
        Route("/metrics", guarded(metrics_text)), Route("/v2", guarded(server_meta)),
        Route("/v2/models/{name}", guarded(model_meta)), Route("/v2/models/{name}/ready", guarded(model_ready)),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})
