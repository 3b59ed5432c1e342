"""The HTTP side of ``minidet serve``: a Starlette application (:class:`Server`) in front of the worker pool.

- ``POST /predict``: the image's bytes as the body (``Content-Type: image/*``) or a multipart form's ``image`` field;
  the answer is the JSON record ``minidet infer`` writes for that image (``outputs.records``), with the time of each
  stage in a ``Server-Timing`` header. Query: :data:`QUERY` (each parameter's range, checked by
  :func:`parse_options`).
- ``GET /health/live``, ``GET /health/ready`` (and the Open Inference Protocol's ``/v2/health/live|ready``),
  ``GET /metrics`` (Prometheus text), ``GET /v2`` and ``GET /v2/models/<name>`` (metadata: family, classes, config,
  weights SHA-256), ``GET /v2/models/<name>/ready``; ``GET /``: a page to try it in a browser.

Every refusal is a JSON ``{"error": "<one line>"}`` with its status, answered before any model sees the request:
400 for a ``Host`` header that is none of the server's (:class:`Hosts`: a web page cannot read the server through a
name of its own pointed at this machine, DNS rebinding), 401 (a token is set and the request lacks it), 415
(neither ``image/*`` nor a multipart form), 413 (a body over ``--max-body-mb``, or an image whose header shows more
than ``INPUT.MAX_PIXELS`` pixels), 400 (an empty body, bytes of no known image format or that do not decode, a query
parameter unknown, repeated or out of its range), 429 with ``Retry-After`` (the queue is full), 503 (the
model is loading, the request waited past ``--timeout``, or the server stopped before answering it); 500 when the
model failed on it or its worker died while running it. A worker that died is replaced; the requests wait for the
replacement as for any worker (one handed to the worker as it died, before it started it, included). A connection
that sends no complete request head within ``--header-timeout`` is closed (:class:`BoundedHead`), after a 408 when
it sent part of one.

At SIGTERM or Ctrl-C (:class:`GracefulServer`) the requests in flight have ``grace`` seconds: one not answered by
then (an upload still arriving, a request still waiting for or running in a worker) is answered 503, and the server
closes."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from minidet import __version__
from minidet.apps.outputs.options import MASK_FORMATS, MAX_TOLERANCE, OutputOptions, parse_classes
from minidet.apps.serve import protocol
from minidet.apps.serve.metrics import Metrics
from minidet.apps.serve.pool import Job, Pool, QueueFull
from minidet.errors import ConfigError
from minidet.imageio import ImageReadError, check_image_bytes

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CLOSE_AFTER_S = 1.0  # then the time the 503s have to go out before uvicorn closes what is left


def host_of(header: str) -> str:
    """The host of a ``Host`` header (``name:port``, ``[v6]:port``), lower case, without a final dot."""
    header = header.strip().lower()
    if header.startswith("["):
        host = header[1:].partition("]")[0]
    else:
        name, _, port = header.rpartition(":")
        host = name if name and port.isdigit() else header
    return host.rstrip(".")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True)
class Hosts:
    """The hosts a request's ``Host`` header may name. A browser sends the name of the page's address: a page of
    another site whose name its owner points at this machine (DNS rebinding) sends that name, and is refused, so it
    cannot read the server. ``names``: the address the server listens on (and the name it was given), the loopback
    names when that is a loopback address, the ``--allowed-host`` names; ``any_address``: it listens on every
    address (0.0.0.0, ::), and any IP address is one of this machine's; ``anything``: ``--allowed-host '*'``."""

    names: frozenset[str]
    any_address: bool = False
    anything: bool = False

    @classmethod
    def bound(cls, addresses: Iterable[str], allowed: Iterable[str] = ()) -> Hosts:
        """The hosts of a server listening on ``addresses`` (``--host`` as given, the socket's address), plus the
        ``allowed`` names."""
        names = {host_of(a) for a in (*addresses, *allowed)}
        ips = [ip for ip in map(_address, names) if ip is not None]
        everywhere = any(ip.is_unspecified for ip in ips)
        if everywhere or "localhost" in names or any(ip.is_loopback for ip in ips):
            names |= set(LOOPBACK_NAMES)
        return cls(frozenset(names), everywhere, "*" in names)

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered (None: a client of HTTP/1.0, no browser)."""
        if header is None or self.anything:
            return True
        host = host_of(header)
        return host in self.names or (self.any_address and _address(host) is not None)

    def __str__(self) -> str:
        shown = sorted(f"[{n}]" if ":" in n else n for n in self.names if not _address(n) or
                       not _address(n).is_unspecified)
        return ", ".join(shown) + (" or any address of this machine" if self.any_address else "")


@dataclass
class Settings:
    """The server's choices: the model's ``name`` (``/v2/models/<name>``), the bearer ``token`` (None: none),
    the largest body in bytes, ``timeout`` (seconds a request may wait for a worker; 0: no limit), the weights'
    file and SHA-256 (None: random weights), the config file, the ``hosts`` answered (None: any), the shutdown's
    ``grace`` in seconds, the ``header_timeout`` of each request's head (:class:`BoundedHead`)."""

    name: str
    token: str | None
    max_bytes: int
    timeout: float
    weights: str | None
    weights_sha256: str | None
    config_file: str
    hosts: Hosts | None
    grace: float
    header_timeout: float = 0.0  # seconds a connection has to send each request's head (0: no limit)


def note(line: str) -> None:
    """One line of the server's log (stderr)."""
    print(f"serve: {line}", file=sys.stderr, flush=True)


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


@dataclass(frozen=True)
class Param:
    """A query parameter of ``POST /predict``: the field it sets (the request's ``file``, or one of its
    :class:`~minidet.apps.outputs.options.OutputOptions`), what it takes (said in its refusal), and ``read(value,
    class names)``: the field's value, ValueError when the value is out of its range (with a message, or empty for
    the refusal to say what it takes; a ConfigError's line is said as it is)."""

    field: str
    takes: str
    read: Callable[[str, list[str]], object]


def number(low: float, high: float) -> Callable[[str, list[str]], float]:
    def read(value: str, names: list[str]) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan  # no number: out of range, as nan and inf are
        if not low <= x <= high:
            raise ValueError("")
        return x
    return read


def one_of(choices: Iterable[str]) -> Callable[[str, list[str]], str]:
    def read(value: str, names: list[str]) -> str:
        if value not in choices:
            raise ValueError("")
        return value
    return read


def known_classes(value: str, names: list[str]) -> str:
    """``value`` when it names classes of the model (the worker reads them again: ``OutputOptions.keep``); else
    ``parse_classes``'s ConfigError, which names the parameter."""
    parse_classes(value, names, option="classes")
    return value


def text(longest: int) -> Callable[[str, list[str]], str]:
    def read(value: str, names: list[str]) -> str:
        if len(value) > longest:
            raise ValueError("")
        return value
    return read


QUERY = {  # POST /predict's query parameters, each checked against its range by parse_options
    "classes": Param("classes", "the model's class names, comma-separated", known_classes),
    "score_thresh": Param("score_thresh", "a number from 0 to 1", number(0.0, 1.0)),
    "mask_format": Param("mask_format", f"one of {', '.join(MASK_FORMATS)}", one_of(MASK_FORMATS)),
    "tolerance": Param("tolerance", f"a number of pixels from 0 to {MAX_TOLERANCE:g}", number(0.0, MAX_TOLERANCE)),
    "file": Param("file", "a name of at most 4096 characters", text(4096)),
}


def parse_options(query: QueryParams, class_names: list[str]) -> tuple[str, OutputOptions]:
    """The query's ``file`` name ("": none) and output options; HTTPException 400 naming the parameter that is
    unknown, given twice or out of its range (and the range)."""
    values = {}
    for name, value in query.multi_items():
        param = QUERY.get(name)
        if param is None:
            raise HTTPException(400, f"unknown query parameter {name[:100]!r}: POST /predict takes "
                                f"{', '.join(QUERY)}")
        if param.field in values:
            raise HTTPException(400, f"{name}: given more than once; give it once")
        try:
            values[param.field] = param.read(value, class_names)
        except ConfigError as e:  # a reader whose line names the parameter itself (known_classes)
            raise HTTPException(400, str(e)) from None
        except ValueError as e:
            shown = value if len(value) <= 100 else value[:100] + "..."
            raise HTTPException(400, f"{name}: {str(e) or param.takes + ', got ' + repr(shown)}") from None
    return values.pop("file", ""), OutputOptions(**values)


def server_timing(times: dict[str, float]) -> str:
    """An HTTP ``Server-Timing`` value: each stage's milliseconds."""
    return ", ".join(f"{k.replace(' ', '_')};dur={v * 1000:.3f}" for k, v in times.items())


class Server:
    """One server's HTTP side: the application (:attr:`app`) whose endpoints are this object's methods, in front of
    ``pool``, under ``settings``, counted in ``metrics``. Its lifespan starts the pool's workers and, at shutdown
    (after the requests in flight are answered, or their grace is over), stops them. :attr:`stopping`: an event
    that, once set (by :class:`GracefulServer`), has every request not answered yet answered 503; :attr:`cut`: how
    many were."""

    def __init__(self, pool: Pool, settings: Settings, metrics: Metrics | None = None) -> None:
        self.pool, self.settings = pool, settings
        self.metrics = metrics or Metrics(pool)
        self.stopping = asyncio.Event()
        self.cut = 0
        self.observed: list[float] = []  # the last requests' model seconds, for Retry-After
        self.page = resources.files("minidet.apps.serve").joinpath("page.html").read_text()
        self.app = self._application()

    def _application(self) -> Starlette:
        """The Starlette application: the routes (the token's guard where it applies), the ``Host`` check, the
        error handlers; ``app.state``: ``stopping``, ``server`` (this object) and ``protocol``, the HTTP protocol to
        serve it with (``uvicorn.Config(http=...)``: the bound on each request's head, :func:`head_bounded`)."""
        guarded = self.guarded
        routes = [
            Route("/", self.index), Route("/predict", guarded(self.predict), methods=["POST"]),
            Route("/health/live", self.live), Route("/health/ready", self.ready),
            Route("/v2/health/live", self.live), Route("/v2/health/ready", self.ready),
            Route("/metrics", guarded(self.metrics_text)), Route("/v2", guarded(self.server_meta)),
            Route("/v2/models/{name}", guarded(self.model_meta)),
            Route("/v2/models/{name}/ready", guarded(self.model_ready)),
        ]
        hosts = self.settings.hosts
        middleware = [Middleware(HostCheck, hosts=hosts, refused=self.refused_host)] if hosts else []
        app = Starlette(routes=routes, lifespan=self.lifespan, middleware=middleware,
                        exception_handlers={HTTPException: self.http_error, Exception: self.server_error})
        app.state.stopping = self.stopping
        app.state.server = self
        app.state.protocol = head_bounded(self.settings.header_timeout,
                                          lambda partial: self.metrics.rejections.labels("header_timeout").inc())
        return app

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.pool.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, self.pool.close)

    def authorized(self, request: Request) -> bool:
        token = self.settings.token
        if token is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())

    def guarded(self, handler):
        """``handler`` behind the token (when one is set): 401 without it, and nothing else runs."""
        async def check(request: Request) -> Response:
            if not self.authorized(request):
                response = error(401, "this server needs its token: send the header 'Authorization: Bearer <token>'",
                                 {"WWW-Authenticate": "Bearer"})
                return self.answered(response, request.url.path if request.url.path == "/predict" else "other")
            return await handler(request)
        return check

    def answered(self, response: Response, endpoint: str = "/predict") -> Response:
        self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    def refused_host(self, host: str | None) -> Response:
        self.metrics.rejections.labels("host").inc()
        return self.answered(error(400, f"Host {(host or '')[:100]!r}: this server answers only "
                                   f"{self.settings.hosts}; start it with --allowed-host NAME to answer another name"),
                             "other")

    async def predict(self, request: Request) -> Response:
        """``POST /predict``: :meth:`_predict`'s answer, or 503 once the shutdown's grace is over."""
        metrics = self.metrics
        t0 = time.monotonic()
        work = asyncio.ensure_future(self._predict(request))
        stop = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if work.done():
            response = work.result()
        else:  # the shutdown's grace is over
            work.cancel()
            self.cut += 1
            metrics.rejections.labels("stopping").inc()
            response = error(503, f"the server is stopping and this request was not answered within its grace of "
                             f"{self.settings.grace:g} s (--grace); it was not run, or its answer is lost")
        metrics.latency.labels(str(response.status_code)).observe(time.monotonic() - t0)
        if response.status_code == 200:
            metrics.bytes_out.inc(len(response.body))
        return self.answered(response)

    async def _predict(self, request: Request) -> Response:
        pool, settings, metrics = self.pool, self.settings, self.metrics
        if pool.facts is None or not pool.started_all:  # once loaded, requests wait for a worker being replaced
            return error(503, "the model is loading; retry when /health/ready answers 200", {"Retry-After": "1"})
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not (ctype.startswith("image/") or ctype == "multipart/form-data"):
            return error(415, f"Content-Type {ctype or '(none)'}: send the image's bytes as image/* (image/jpeg, "
                         "image/png, ...) or a multipart/form-data form with a file field named 'image'")
        length = request.headers.get("content-length", "")
        limit = f"the body is larger than the server's limit of {settings.max_bytes} bytes (--max-body-mb)"
        if length.isdigit() and int(length) > settings.max_bytes:
            return error(413, limit)
        try:
            file, options = parse_options(request.query_params, pool.facts["class_names"])
            try:
                body = await read_capped(request, settings.max_bytes)
            except ClientDisconnect:
                metrics.rejections.labels("client_gone").inc()
                note(f"a client ({client_of(request)}) went away before its upload ended; nothing was run")
                return error(400, "the client went away before the body ended")
            if body is None:
                return error(413, limit)
            data = body
            if ctype == "multipart/form-data":
                data, filename = await form_image(request, body)
                file = request.query_params.get("file", filename)
        except HTTPException as e:
            return error(e.status_code, e.detail)
        name = file or "image"
        if not data:
            return error(400, f"{name}: empty body (0 bytes): send the image's encoded bytes")
        try:
            check_image_bytes(data, name, pool.facts["max_pixels"])
        except ImageReadError as e:
            return error(413 if e.too_large else 400, str(e))
        loop = asyncio.get_running_loop()
        job = Job(protocol.Request(data, file, options), loop, loop.create_future())
        try:
            pool.submit(job)
        except QueueFull:
            metrics.rejections.labels("queue_full").inc()
            retry = max(1, math.ceil(pool.max_queue * self.typical_seconds() / max(1, pool.ready_workers)))
            return error(429, f"the server is busy: {pool.max_queue} requests wait already (--max-queue); "
                         f"retry in {retry} s", {"Retry-After": str(retry)})
        if settings.timeout:
            done, _ = await asyncio.wait({job.future}, timeout=settings.timeout)
            if not done and job.drop():
                pool.release(job)
                job.future.cancel()
                return self.timed_out(time.monotonic() - job.queued)
        answer = await job.future
        if isinstance(answer, protocol.Timeout):
            return self.timed_out(answer.waited)
        if isinstance(answer, protocol.Result):
            times = answer.times
            metrics.observe_times(times)
            self.observed.append(sum(v for k, v in times.items() if k != "serialize"))
            del self.observed[:-50]
            metrics.queue_wait.observe(job.waited)
            headers = {"Server-Timing": server_timing({"queue": job.waited, **times})}
            return Response(answer.body, media_type="application/json", headers=headers)
        return error(answer.status, answer.line)  # ClientError, ServerError

    def typical_seconds(self) -> float:
        return sorted(self.observed)[len(self.observed) // 2] if self.observed else 1.0

    def timed_out(self, waited: float) -> Response:
        self.metrics.rejections.labels("timeout").inc()
        return error(503, f"the request waited {waited:.1f} s for a worker, longer than the server's --timeout of "
                     f"{self.settings.timeout:g} s; it was not run", {"Retry-After": "1"})

    async def live(self, request: Request) -> Response:
        return self.answered(JSONResponse({"live": True}), request.url.path)

    async def ready(self, request: Request) -> Response:
        ok, workers = self.pool.readiness()
        body = {"ready": ok, "workers_ready": workers, "workers": self.pool.n}
        return self.answered(JSONResponse(body, status_code=200 if ok else 503), request.url.path)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def server_meta(self, request: Request) -> Response:
        return JSONResponse({"name": "minidet", "version": __version__, "extensions": ["minidet_predict"],
                             "models": [self.settings.name]})

    def model_or_404(self, request: Request) -> None:
        if request.path_params["name"] != self.settings.name:
            raise HTTPException(404, f"no model {request.path_params['name']!r}; this server has "
                                f"{self.settings.name!r}")

    async def model_meta(self, request: Request) -> Response:
        self.model_or_404(request)
        pool, settings = self.pool, self.settings
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

    async def model_ready(self, request: Request) -> Response:
        self.model_or_404(request)
        ok = self.pool.ready
        return JSONResponse({"name": self.settings.name, "ready": ok}, status_code=200 if ok else 503)

    async def index(self, request: Request) -> Response:
        return HTMLResponse(self.page)

    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = (f"no endpoint {request.url.path}: POST /predict, GET / (a page to try it), /health/live, "
                      "/health/ready, /metrics, /v2, /v2/models/<name>")
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return error(exc.status_code, detail, getattr(exc, "headers", None))

    async def server_error(self, request: Request, exc: Exception) -> Response:
        return error(500, f"{type(exc).__name__}: {exc}")


def client_of(request: Request) -> str:
    return f"{request.client.host} port {request.client.port}" if request.client else "unknown"


def build_app(pool: Pool, settings: Settings, metrics: Metrics | None = None) -> Starlette:
    """The application of a :class:`Server` in front of ``pool`` (``app.state.server``: that server)."""
    return Server(pool, settings, metrics).app


class HostCheck:
    """ASGI middleware: a request whose ``Host`` header ``hosts`` does not allow is answered ``refused(host)``,
    and nothing else runs."""

    def __init__(self, app, hosts: Hosts, refused: Callable[[str | None], Response]) -> None:
        self.app, self.hosts, self.refused = app, hosts, refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if not self.hosts.allows(host):
                await self.refused(host)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a bounded graceful shutdown: at SIGTERM or Ctrl-C it stops listening, and the requests
    in flight have ``grace`` seconds; then ``stopping`` is set (each one not answered yet is answered 503), and a
    moment later uvicorn closes the connections left (an upload that goes on) and the workers stop."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event, grace: float) -> None:
        config.timeout_graceful_shutdown = grace + CLOSE_AFTER_S
        super().__init__(config)
        self.stopping, self.grace = stopping, grace

    async def shutdown(self, sockets=None) -> None:
        asyncio.get_running_loop().call_later(self.grace, self.stopping.set)
        await super().shutdown(sockets)


def graceful_server(http: Server, debug: bool = False) -> GracefulServer:
    """``minidet serve``'s uvicorn server of ``http``: its application with its lifespan, no ``Server`` header, its
    HTTP protocol (``app.state.protocol``: the bound on each request's head), the grace of its settings; uvicorn's
    log at level warning (``debug``: info, with the access log)."""
    config = uvicorn.Config(http.app, log_level="info" if debug else "warning", access_log=debug, lifespan="on",
                            server_header=False, http=http.app.state.protocol)
    return GracefulServer(config, http.stopping, http.settings.grace)


class BoundedHead:
    """A mixin for uvicorn's HTTP protocols (``uvicorn.Config(http=...)``, see :func:`head_bounded`): a connection
    has ``head_timeout`` seconds, from its opening or from the previous answer, to send a request's line and headers
    (0: no limit). One that sent none of them by then is closed; one that sent part of them is answered 408 with its
    JSON line, then closed; ``on_late(partial)`` counts each. The body is not timed here: a slow upload whose head
    came in time goes on, as the server's other limits allow. (uvicorn's keep-alive timeout bounds only the idle
    time after an answer; a connection that sent nothing, or half a head, was kept open for ever.)"""

    head_timeout: float = 0.0
    on_late: Callable[[bool], None] | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_cycle = None
        self._head_partial = False
        self._await_head()

    def data_received(self, data: bytes) -> None:
        self._head_partial = True
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._head_cycle:  # the head is complete
            self._head_timer.cancel()
            self._head_timer = None

    def on_response_complete(self) -> None:
        before = self.cycle
        super().on_response_complete()
        if self.cycle is before and not self.transport.is_closing():  # no next request's head yet
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_cycle, self._head_partial, self._head_timer = self.cycle, False, None
        if self.head_timeout > 0:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport.is_closing() or transport.get_protocol() is not self:  # closed, or upgraded to another protocol
            return
        if self._head_partial:
            body = error(408, f"the request's line and headers did not arrive within {self.head_timeout:g} s "
                         "(--header-timeout); the connection is closed").body
            transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        transport.close()
        if self.on_late is not None:
            self.on_late(self._head_partial)


def head_bounded(seconds: float, on_late: Callable[[bool], None] | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (its ``auto`` choice) with :class:`BoundedHead`'s bound of ``seconds`` on each
    request's head."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return type("BoundedHeadProtocol", (BoundedHead, AutoHTTPProtocol), {"head_timeout": seconds,
                                                                          "on_late": staticmethod(on_late)})
