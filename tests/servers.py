"""Test support: a client of a ``minidet serve`` server (:class:`Client`), one in a process of its own
(:class:`Server`), raw connections (:func:`raw_upload`, :func:`closed_after`), and a multipart form body."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

START_S = 180  # the longest wait for a server to be ready (spawned workers import torch and load the model)


class Client:
    """Requests to a server listening on ``host``:``port`` (set by the subclass): ``request``, ``predict``,
    ``metric``."""

    host: str
    port: int

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 120) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def predict(self, data: bytes, ctype: str = "image/png", query: str = "", headers: dict | None = None):
        return self.request("POST", "/predict" + (f"?{query}" if query else ""), data,
                            {"Content-Type": ctype, **(headers or {})})

    def metric(self, name: str, headers: dict | None = None) -> float:
        """The sum of the samples of metric ``name`` whose labels include those given, as in
        'minidet_stage_seconds_count{stage="fpn"}'."""
        base, _, labels = name.partition("{")
        wanted = re.findall(r'\w+="[^"]*"', labels)
        text = self.request("GET", "/metrics", headers=headers)[2].decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if re.split(r"[{ ]", line, maxsplit=1)[0] == base and all(w in line for w in wanted))


class Server(Client):
    """``minidet serve ARGS --port 0`` in a process of its own; ``wait_ready``, ``stop``."""

    def __init__(self, *args: str, cwd: Path) -> None:
        env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
        code = "import sys; from minidet.apps.cli import main; sys.exit(main())"
        self.proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", "0", *args], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True).start()
        first = self.proc.stdout.readline()
        self.out.append(first)
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True).start()
        m = re.search(r"listening on http://([\d.]+):(\d+)", first)
        assert m, (first, self.proc.wait(30), "".join(self.err))
        self.host, self.port = m.group(1), int(m.group(2))

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_ready(self, headers: dict | None = None) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, ("".join(self.out), "".join(self.err))
            if self.request("GET", "/health/ready", headers=headers)[0] == 200:
                return
            time.sleep(0.2)
        raise AssertionError(f"not ready after {START_S} s: {''.join(self.out)} {''.join(self.err)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def raw_upload(server: Client, sent: bytes, length: int, host: str | None = None) -> socket.socket:
    """A connection that sent POST /predict's head announcing ``length`` body bytes, and ``sent`` of them."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    head = (f"POST /predict HTTP/1.1\r\nHost: {host or f'{server.host}:{server.port}'}\r\n"
            f"Content-Type: image/png\r\nContent-Length: {length}\r\n\r\n")
    sock.sendall(head.encode() + sent)
    return sock


def closed_after(sock: socket.socket) -> tuple[float, bytes]:
    """The seconds until the server closes ``sock``, and what it sent before."""
    t0, got = time.monotonic(), bytearray()
    sock.settimeout(60)
    while chunk := sock.recv(65536):
        got.extend(chunk)
    return time.monotonic() - t0, bytes(got)


def multipart(data: bytes, filename: str, field: str = "image") -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"
