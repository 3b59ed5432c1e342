"""A real HTTP server on 127.0.0.1 for the download tests: generated files, ``Range`` requests, a connection cut
halfway, slow transfers, every request recorded."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import threading
import time


def checkpoint_bytes(size: int) -> bytes:
    """``size`` random bytes behind a pickle protocol 2 header: what a download of a checkpoint starts with (minidet
    refuses a download that does not look like one), different at every call."""
    return b"\x80\x02" + os.urandom(size - 2)


class FileServer:
    """A threaded HTTP server serving ``files`` (URL path -> bytes), with ``Range: bytes=N-`` support. ``cut``:
    paths whose first request gets half of the bytes, then the connection closes; ``slow``: paths sent in small
    pieces with pauses of ``pause`` seconds. ``requests``: (path, Range header or None) of every GET."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: set[str] = set()
        self.slow: set[str] = set()
        self.pause = 0.05
        self.requests: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                with server._lock:
                    server.requests.append((self.path, self.headers.get("Range")))
                    cut = self.path in server.cut
                    server.cut.discard(self.path)
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start, status = 0, 200
                if (m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))) is not None:
                    start = int(m[1])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                body = data[start:]
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if cut:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.path in server.slow:
                    for i in range(0, len(body), len(body) // 8 + 1):
                        self.wfile.write(body[i : i + len(body) // 8 + 1])
                        self.wfile.flush()
                        time.sleep(server.pause)
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def add(self, path: str, size: int, seed: int = 0) -> tuple[str, bytes, str]:
        """Serve ``checkpoint_bytes(size)`` at ``path``: (URL, bytes, SHA-256)."""
        data = checkpoint_bytes(size)
        self.files[path] = data
        return self.url + path, data, hashlib.sha256(data).hexdigest()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
