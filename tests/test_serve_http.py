"""``minidet serve``'s HTTP side where no worker process is the subject: the real application (``app.Server``)
served as ``minidet serve`` serves it (``app.graceful_server``: uvicorn with its lifespan and the HTTP protocol that
bounds each request's head) on 127.0.0.1, in a thread of this process, in front of a fake pool (:class:`FakePool`)
that keeps each request it is handed and answers it at once with a fixed record.

Each refusal the HTTP side makes (415, 400, 413, 405, 404) is one JSON line, answered before the pool sees the
request, and the next request is served; with a token, 401 without it; a client gone mid-upload is one log line;
Host names not the server's are refused (DNS rebinding); connections that send no request are closed
(--header-timeout), a slow upload whose head came at once is served. test_serve.py has what the worker processes do.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import threading
import time

import cv2
import pytest

from helpers import config, images_bgr, needs_extra
from minidet.apps.serve.pool import Pool
from minidet.apps.serve.protocol import Result
from servers import Client, closed_after, multipart, raw_upload

pytestmark = needs_extra("starlette", "serve")
SERIAL = pytest.mark.serial  # timed by the wall clock: the suite's serial part (tools/test.sh)

CONFIG = "configs/torchvision/maskrcnn_resnet50_fpn.yaml"
NAME = "maskrcnn_resnet50_fpn"  # the model's name: the config file's, as minidet serve names it
START_S = 30  # the longest wait for a server in this process to start listening, or to stop
HEADER_TIMEOUT_S = 2.0  # --header-timeout of test_connections_that_send_no_request_are_closed's server
# the fake pool's answer to every request: a record as minidet infer writes it (one person, its mask as an RLE)
RECORD = {"file": "", "height": 240, "width": 320, "instances": [
    {"bbox": [60.0, 40.0, 80.0, 80.0], "score": 0.98, "category_id": 1, "category_name": "person",
     "segmentation": {"size": [240, 320], "counts": "XS>`2P5" + "0" * 151 + "hTZ1"}}]}
TIMES = {"decode": 0.002, "preprocess": 0.001, "backbone": 0.05, "fpn": 0.01, "rpn": 0.01, "box_head": 0.01,
         "mask_head": 0.01, "paste": 0.002, "serialize": 0.001}  # seconds by stage, as a worker says them


def torchvision_facts() -> dict:
    """What ``worker.load`` says of torchvision's Mask R-CNN (``CONFIG``) with random weights: family, runtime, COCO's
    91 class slots (minidet's ``categories``), the config, ``INPUT.MAX_PIXELS``, ..."""
    from minidet.categories import coco_classes

    cfg = config(CONFIG, weights="none")
    classes = coco_classes(cfg.MODEL.CATEGORY_LAYOUT)
    return {"family": cfg.MODEL.CONVENTION, "runtime": cfg.MODEL.RUNTIME, "class_names": list(classes.names),
            "classes": [{"index": k, "id": i, "name": n} for k, (i, n) in enumerate(zip(classes.ids, classes.names))],
            "weights_summary": "none (random weights: MODEL.WEIGHTS none)", "classes_summary": "",
            "config": cfg.dump(), "max_pixels": int(cfg.INPUT.MAX_PIXELS), "warmup_seconds": 0.0, "threads": 1}


class FakePool:
    """What ``app.Server`` and its ``Metrics`` use of ``pool.Pool``, without processes: ``n`` workers, ready from
    :meth:`start` (the model's facts known at once) to :meth:`close`. :meth:`submit` keeps each job
    (:attr:`submitted`) and queues it; a thread answers it at once, as ``Pool._feed`` hands a worker's answer back:
    the job taken (``Job.take``), resolved with :data:`RECORD`, released (``Pool.release``). It never refuses a job
    (no 429)."""

    def __init__(self, n: int = 1, max_queue: int = 16) -> None:
        self.n, self.max_queue = n, max_queue
        self.queue: queue.Queue = queue.Queue()
        self.facts: dict | None = None
        self.started_all = False
        self.closed = False
        self.restarts = 0
        self.pids: dict[int, int] = {}  # no worker processes: no worker memory in /metrics
        self.submitted: list = []  # every job submit was handed, in order
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._feed, name="fake-pool", daemon=True)

    readiness, ready, release = Pool.readiness, Pool.ready, Pool.release  # the real pool's, on these attributes

    @property
    def ready_workers(self) -> int:
        return self.n if self.started_all and not self.closed else 0

    def start(self) -> None:
        self.facts = torchvision_facts()
        self.started_all = True
        self._thread.start()

    def submit(self, job) -> None:
        with self._lock:
            self.submitted.append(job)
            self._pending += 1
        self.queue.put(job)

    def close(self) -> None:
        self.closed = True
        self.queue.put(None)
        self._thread.join(START_S)

    def _feed(self) -> None:
        body = json.dumps(RECORD).encode()
        while (job := self.queue.get()) is not None:
            if job.take():
                job.resolve(Result(body, dict(TIMES)))
            self.release(job)


class InThread(Client):
    """``app.Server`` in front of a :class:`FakePool` (:attr:`pool`), under ``minidet serve``'s settings (its
    defaults, then ``settings``; ``allowed``: the ``--allowed-host`` names), served by ``app.graceful_server`` in a
    thread on 127.0.0.1 at a free port, bound as ``program.bind`` binds it; :meth:`stop`."""

    def __init__(self, allowed: tuple[str, ...] = (), **settings) -> None:
        from minidet.apps.serve import program
        from minidet.apps.serve.app import Hosts, Server, Settings, graceful_server

        sock = program.bind("127.0.0.1", 0)
        self.host, self.port = sock.getsockname()[:2]
        chosen = {"name": NAME, "token": None, "max_bytes": 32 * 2**20, "timeout": 30.0, "weights": None,
                  "weights_sha256": None, "config_file": CONFIG, "grace": program.GRACE_S,
                  "hosts": Hosts.bound(("127.0.0.1", self.host), allowed),
                  "header_timeout": program.HEADER_TIMEOUT_S,
                  **settings}
        self.pool = FakePool()
        self.server = graceful_server(Server(self.pool, Settings(**chosen)))
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(sock,), name="minidet-serve", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_S
        while not self.server.started:
            assert self.thread.is_alive() and not self.failed, f"the server did not start: {self.failed}"
            assert time.monotonic() < deadline, f"the server did not start in {START_S} s"
            time.sleep(0.01)

    def _run(self, sock: socket.socket) -> None:
        try:
            self.server.run(sockets=[sock])
        except BaseException as e:  # noqa: BLE001 - said by stop, in the test's thread
            self.failed.append(e)
        finally:
            sock.close()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(START_S)
        assert not self.thread.is_alive(), f"the server did not stop in {START_S} s"
        assert not self.failed, self.failed


@pytest.fixture
def serve():
    """``serve(allowed=(), **settings)``: a started :class:`InThread` server; each one is stopped at the test's
    end, its thread joined."""
    started: list[InThread] = []

    def start(allowed: tuple[str, ...] = (), **settings) -> InThread:
        started.append(InThread(allowed, **settings))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def png() -> bytes:
    """A 320 x 240 PNG."""
    ok, data = cv2.imencode(".png", images_bgr([(240, 320)], seed=3)[0])
    assert ok
    return data.tobytes()


def test_refusals_are_one_json_line_and_the_next_request_is_served(serve, png):
    """Each bad request gets its status and a JSON error line before the pool sees it (a PNG cut short is its
    worker's to refuse: test_serve.py); a good one is served after."""
    s = serve(max_bytes=2**20)  # --max-body-mb 1
    w, h = 30000, 30000  # a PNG header announcing 900 megapixels: refused before decoding
    bomb = b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR" + w.to_bytes(4, "big") + h.to_bytes(4, "big") + \
        bytes([8, 2, 0, 0, 0]) + b"\0" * 4 + b"\0" * 64
    cases = [
        (s.predict(png, "text/plain"), 415, "Content-Type text/plain"),
        (s.request("POST", "/predict", png), 415, "Content-Type (none)"),
        (s.predict(b""), 400, "empty body"),
        (s.predict(b"not an image at all"), 400, "not a recognized image format"),
        (s.predict(b"\x89PNG\r\n\x1a\n" + os.urandom(2_000_000)), 413, "--max-body-mb"),
        (s.predict(bomb), 413, "exceeds INPUT.MAX_PIXELS"),
        (s.predict(png, query="classes=unicorn"), 400, "unknown class 'unicorn'"),
        (s.predict(png, query="score_thresh=2"), 400, "score_thresh"),
        (s.predict(png, query="mask_format=png"), 400, "mask_format"),
        (s.predict(png, query="mask_format=polygon&tolerance=-1"), 400, "tolerance"),
        (s.predict(*multipart(png, "a.png", field="photo")), 400, "file field named 'image'"),
        (s.request("GET", "/predict"), 405, ""),
        (s.request("GET", "/v2/models/other"), 404, "no model 'other'"),
    ]
    for (status, headers, body), want, text in cases:
        assert status == want, (want, body)
        assert headers["content-type"].startswith("application/json")
        line = json.loads(body)["error"]
        assert text in line and "\n" not in line, (want, line)
    assert s.pool.submitted == [], "a refused request reached the pool"
    status, _, body = s.predict(png)
    assert status == 200 and json.loads(body)["instances"]
    assert len(s.pool.submitted) == 1 and s.pool.submitted[0].request.data == png
    assert s.metric('minidet_requests_total{endpoint="/predict",status="415"}') == 2


def test_token(serve, png, tmp_path):
    """With --token-file: 401 without the token (the pool never sees the request), 200 with it; health stays open."""
    from minidet.apps.serve.program import read_token

    (tmp_path / "token").write_text("s3cret-token\n")
    s = serve(token=read_token(str(tmp_path / "token")))
    good = {"Authorization": "Bearer s3cret-token"}
    assert s.request("GET", "/health/ready")[0] == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
        status, h, body = s.predict(png, headers=headers)
        assert status == 401 and h["www-authenticate"] == "Bearer" and "token" in json.loads(body)["error"]
    assert s.request("GET", f"/v2/models/{NAME}")[0] == 401
    assert s.request("GET", "/metrics")[0] == 401
    assert s.request("GET", "/metrics", headers=good)[0] == 200
    assert s.pool.submitted == []
    assert s.predict(png, headers=good)[0] == 200
    assert len(s.pool.submitted) == 1


def test_a_client_gone_mid_upload_is_one_log_line(serve, png, capfd):
    """An upload that breaks off is one line on the server's log (stderr), nothing run, counted as client_gone; the
    next request is served."""
    s = serve()
    capfd.readouterr()
    raw_upload(s, png[:1000], 100_000).close()
    err = ""
    deadline = time.monotonic() + 10
    while "went away" not in err:
        assert time.monotonic() < deadline, err
        time.sleep(0.05)
        err += capfd.readouterr().err
    time.sleep(0.5)  # anything more it would write
    new = (err + capfd.readouterr().err).splitlines()
    assert len(new) == 1 and "before its upload ended; nothing was run" in new[0], new
    assert s.metric('minidet_rejections_total{reason="client_gone"}') == 1
    assert s.pool.submitted == []
    assert s.predict(png)[0] == 200


def test_host_names_not_the_servers_are_refused(serve, png):
    """Without a token, a page of any site whose name is pointed at 127.0.0.1 (DNS rebinding) could read the server
    as its own: only its addresses, the loopback names and --allowed-host names are answered."""
    s = serve(allowed=("minidet.test",))
    for host in ("evil.example", f"evil.example:{s.port}", f"127.0.0.1.evil.example:{s.port}"):
        for method, path in (("GET", "/"), ("GET", "/health/ready"), ("GET", f"/v2/models/{NAME}")):
            status, headers, body = s.request(method, path, headers={"Host": host})
            line = json.loads(body)["error"]
            assert status == 400 and headers["content-type"].startswith("application/json"), (host, path, body)
            assert line.startswith(f"Host '{host}': this server answers only 127.0.0.1, [::1], localhost, "
                                   "minidet.test") and "--allowed-host" in line, line
        status, _, body = s.predict(png, headers={"Host": host})
        assert status == 400 and "--allowed-host" in json.loads(body)["error"]
    assert s.pool.submitted == []
    assert s.metric('minidet_rejections_total{reason="host"}') == 12
    for host in (f"127.0.0.1:{s.port}", f"localhost:{s.port}", f"[::1]:{s.port}", "LOCALHOST", "minidet.test",
                 f"minidet.test:{s.port}"):
        assert s.request("GET", "/health/ready", headers={"Host": host})[0] == 200, host
    assert s.predict(png, headers={"Host": "minidet.test"})[0] == 200
    assert len(s.pool.submitted) == 1


@SERIAL
def test_connections_that_send_no_request_are_closed(serve, png):
    """9a: a connection that sends nothing, or part of a request's head and no more, is closed after
    --header-timeout (it was kept open for ever): the second with a 408 and its JSON line. An upload slower than that
    whose head came at once is served, as before."""
    s = serve(header_timeout=HEADER_TIMEOUT_S)
    silent = socket.create_connection((s.host, s.port), timeout=60)
    partial = socket.create_connection((s.host, s.port), timeout=60)
    partial.sendall(f"POST /predict HTTP/1.1\r\nHost: {s.host}:{s.port}\r\nContent-Type: image/png\r\n".encode())
    with silent, partial:
        took, got = closed_after(silent)
        assert got == b"" and HEADER_TIMEOUT_S - 0.2 < took < HEADER_TIMEOUT_S + 5, (took, got)
        took, got = closed_after(partial)
    assert took < 5, took  # closed at about the same time as the silent one
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), got
    line = json.loads(body)["error"]
    assert "\n" not in line and f"within {HEADER_TIMEOUT_S:g} s (--header-timeout)" in line, line
    assert s.metric('minidet_rejections_total{reason="header_timeout"}') == 2
    # a slow upload: the head at once, the body over twice the head's bound
    step = len(png) // 8 + 1
    with raw_upload(s, b"", len(png)) as sock:
        for k in range(8):
            time.sleep(HEADER_TIMEOUT_S / 4)
            sock.sendall(png[k * step:(k + 1) * step])
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200 and json.loads(response.read())["instances"]
    assert [job.request.data for job in s.pool.submitted] == [png]
