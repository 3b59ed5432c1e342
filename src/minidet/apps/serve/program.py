"""``minidet serve``: any model minidet loads (every family, own classes, an exported graph on ONNX Runtime or
OpenVINO) behind HTTP, answering exactly what ``minidet infer`` writes.

Usage::

    minidet serve --config-file CFG [--host 127.0.0.1] [--port 8080] [--workers N] [--threads T] [--max-queue N]
                  [--timeout S] [--token-file FILE] [--max-body-mb MB] [--name NAME] [--grace S]
                  [--header-timeout S] [--allowed-host NAME ...] [KEY VALUE ...]

The config and overrides are ``minidet infer``'s. ``--workers`` processes each load the model (``--threads`` torch
threads each; default: torch's thread count, which ``minidet infer`` uses, shared out) and run one image per
forward, so that an answer never depends on other requests; at most ``--max-queue`` requests wait for them (more:
429 at once), none longer than ``--timeout`` seconds (then 503, never run). A connection has ``--header-timeout``
seconds to send each request's line and headers (then it is closed, with a 408 if it sent part of them).
``--token-file``: the requests need ``Authorization: Bearer <the file's token>`` (the health endpoints and the page
excepted). Requests whose ``Host`` is none of the server's are refused (DNS rebinding): its address, the loopback names
for a loopback address, any IP address when it listens on all, and the ``--allowed-host`` names. SIGTERM or Ctrl-C: no
new connections, the requests in flight answered within ``--grace`` seconds (those still unanswered then: 503), then
exit (status 0 for SIGTERM, 130 for Ctrl-C). Endpoints: ``minidet.apps.serve.app``.
Needs the ``serve`` extra: ``pip install 'minidet[serve]'``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

from minidet.apps import FAILURES, fail, failure, parse_with_overrides
from minidet.config import load_cfg
from minidet.errors import ConfigError
from minidet.hub import weights_path

EXTRA = "the serve extra is not installed: pip install 'minidet[serve]'"
# each numeric option's range, checked by parse_args: a value outside is one usage line (--port 70000 and
# --worker-nice -5 used to fail later, with a traceback or a worker that could not start)
RANGES = (("--workers", 1, 1024), ("--max-queue", 1, 10**6), ("--threads", 1, 1024), ("--port", 0, 65535),
          ("--worker-nice", 0, 19), ("--timeout", 0, 10**6), ("--max-body-mb", 1e-6, 10**6), ("--grace", 0, 3600),
          ("--header-timeout", 0, 3600))
GRACE_S = 10.0  # the default --grace: after SIGTERM or Ctrl-C, the seconds the requests in flight have
HEADER_TIMEOUT_S = 10.0  # the default --header-timeout: for a request's line and headers, from the connection's
# opening or the previous answer (a client that connects and sends nothing held a connection for ever)


def parse_args(argv: list[str] | None = None, prog: str = "minidet serve") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="Serve a Mask R-CNN over HTTP (POST /predict; GET / for a "
                                "page to try it).")
    p.add_argument("--config-file", required=True, metavar="CFG", help="yaml config file or a config's name")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (0: any free one, printed)")
    p.add_argument("--workers", type=int, default=1, help="model processes (each its own model)")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: torch's count, as infer uses, "
                   "shared out among the workers)")
    p.add_argument("--max-queue", type=int, metavar="N",
                   help="requests that may wait for a worker (more: 429 at once); default half the workers (at least "
                        "1), so that an accepted request waits less than one forward")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="seconds a request may wait for a worker (then 503; 0: no limit)")
    p.add_argument("--worker-nice", type=int, default=0, metavar="N",
                   help="niceness added to the workers, so that the HTTP process answers (and refuses) at once "
                        "while they use every core")
    p.add_argument("--token-file", metavar="FILE", help="a file holding the bearer token requests must send")
    p.add_argument("--max-body-mb", type=float, default=32.0, metavar="MB", help="largest request body (then 413)")
    p.add_argument("--name", help="the model's name in /v2/models/<name> (default: the config file's name)")
    p.add_argument("--grace", type=float, default=GRACE_S, metavar="S",
                   help=f"at SIGTERM or Ctrl-C, the seconds the requests in flight have to be answered; those still "
                        f"unanswered then get 503 and the server exits (default {GRACE_S:g})")
    p.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S, metavar="S",
                   help="seconds a connection has to send each request's line and headers, from its opening or the "
                        "previous answer; then it is closed (with a 408 if it sent part of them; the body is not "
                        f"timed). 0: no limit (default {HEADER_TIMEOUT_S:g})")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="another name the requests' Host header may carry (repeat for more; '*': any), e.g. the "
                        "name a reverse proxy or a LAN uses; the address listened on (and localhost for a loopback "
                        "one) is always allowed")
    p.add_argument("--debug", action="store_true", help="tracebacks for errors, and the server's own log")
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    args = parse_with_overrides(p, argv)
    for flag, low, high in RANGES:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not low <= value <= high:
            p.error(f"{flag} must be a number from {low:g} to {high:g}, got {value:g}")
    for name in args.allowed_host:
        if not name or any(c.isspace() or c in "/,@" for c in name):
            p.error(f"--allowed-host {name!r}: one host name or address (no spaces, commas or slashes)")
    return args


def read_token(path: str | None) -> str | None:
    """The token in ``path`` (surrounding white space dropped); ConfigError for a missing or empty file."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--token-file {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"--token-file {path}: the file must hold one token (no spaces), and it is "
                          f"{'empty' if not token else 'several words'}")
    return token


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; ConfigError naming it when the address cannot be used."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, *_, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None, prog: str = "minidet serve") -> int:
    args = parse_args(argv, prog)
    try:
        from minidet.apps.serve.app import GracefulServer, Hosts, Server, Settings, graceful_server
        from minidet.apps.serve.pool import Pool
        from minidet.apps.serve.worker import Spec
    except ImportError as e:
        return fail(f"{EXTRA} ({e})", args.debug)
    try:
        cfg = load_cfg(args.config_file, args.opts)
        token = read_token(args.token_file)
        weights = weights_path(cfg.MODEL.WEIGHTS)  # downloaded once, here, not by each worker
        digest = None
        if weights is not None:
            from minidet.hub.downloads import file_sha256

            digest = file_sha256(weights)
        sock = bind(args.host, args.port)
    except FAILURES as e:
        return failure(e, args.debug)
    import torch

    # infer's default is torch's thread count: one worker gets the same, so that its answers are infer's to the bit
    # (float sums split over another number of threads differ in the last bits)
    threads = args.threads or max(1, torch.get_num_threads() // args.workers)
    name = args.name or os.path.splitext(os.path.basename(args.config_file))[0]
    spec = Spec(cfg, weights, threads, args.debug, args.worker_nice)
    fatal: list[str] = []
    server: GracefulServer | None = None
    t0 = time.monotonic()

    def on_ready(facts: dict) -> None:
        print(f"serve: ready in {time.monotonic() - t0:.1f} s: {name}, weights {facts['weights_summary']}", flush=True)

    def on_fatal(line: str) -> None:
        fatal.append(line)
        if server is not None:
            server.should_exit = True

    def on_restart(line: str) -> None:
        print(f"serve: {line}", file=sys.stderr, flush=True)

    queue = args.max_queue or max(1, args.workers // 2)
    pool = Pool(spec, args.workers, queue, args.timeout, on_ready, on_fatal, on_restart)
    host, port = sock.getsockname()[:2]
    settings = Settings(name=name, token=token, max_bytes=int(args.max_body_mb * 2**20), timeout=args.timeout,
                        weights=weights, weights_sha256=digest, config_file=args.config_file,
                        hosts=Hosts.bound((args.host, host), args.allowed_host), grace=args.grace,
                        header_timeout=args.header_timeout)
    http = Server(pool, settings)
    server = graceful_server(http, args.debug)
    shown = f"[{host}]" if ":" in host else host
    print(f"serve: listening on http://{shown}:{port} ({args.workers} worker{'s' if args.workers > 1 else ''}, "
          f"{threads} thread{'s' if threads > 1 else ''} each); loading the model", flush=True)
    stopped: list[int] = []
    # uvicorn answers SIGTERM and Ctrl-C by draining, then raises the signal again to the handler found before it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped.append(signum))
    server.run(sockets=[sock])
    if fatal:
        return fail(fatal[0], args.debug)
    if not server.started:
        return fail("the server did not start (rerun with --debug for its log)", args.debug)
    why = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}.get(stopped[0] if stopped else 0, "stopped")
    cut = http.cut
    answered = (f"{cut} request{'s' if cut > 1 else ''} not answered within the --grace of {args.grace:g} s got 503"
                if cut else "every request in flight was answered")
    print(f"serve: stopped ({why}); {answered}", flush=True)
    return 130 if stopped and stopped[0] == signal.SIGINT else 0
