"""``minidet bench-serve``: the load benchmark of a running ``minidet serve`` (``tools/bench_serve.py``).

Usage::

    minidet bench-serve --url http://127.0.0.1:8080 --images IMG [IMG ...] [--duration 60] [--rates 0.5,1,2]
                        [--token-file FILE] [--json OUT.json] [--soak N]

In order: the unloaded latency (one request at a time), the sustainable rate (as many requests in flight as the
server has workers, for ``--calibrate`` seconds: answers per second), then for each factor of ``--rates`` requests
sent at that multiple of the sustainable rate for ``--duration`` seconds, evenly spaced, whatever the answers
(open loop, as independent users send them). Per phase: answers by status, throughput, p50/p95/p99 latency of the
accepted requests and of the refused ones, and the server's resident memory (its process and its workers', from
``/metrics``) before and after. ``--soak N``: then N requests at the sustainable rate, with the memory before and
after (flat means within 5%). Every loop is bounded in count and time; the client is asyncio on plain sockets, on the
same machine as the server (127.0.0.1), so that its cost is small and known."""

from __future__ import annotations

import argparse
import asyncio
import json
import mimetypes
import re
import statistics
import time
import urllib.parse

from minidet import machine

DRAIN_S = 60.0  # after a phase's last request, the longest wait for the answers in flight


def parse_args(argv: list[str] | None = None, prog: str = "minidet bench-serve") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="Load benchmark of a running minidet serve.")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server (default http://127.0.0.1:8080)")
    p.add_argument("--images", nargs="+", required=True, help="image files sent in turn")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of each loaded phase")
    p.add_argument("--rates", default="0.5,1,2", help="multiples of the sustainable rate, one phase each")
    p.add_argument("--calibrate", type=float, default=20.0, help="seconds to measure the sustainable rate")
    p.add_argument("--unloaded", type=int, default=20, help="requests one at a time for the unloaded latency")
    p.add_argument("--soak", type=int, default=0, metavar="N", help="then N requests at the sustainable rate")
    p.add_argument("--token-file", help="the server's token")
    p.add_argument("--query", default="", help="query string for /predict, e.g. mask_format=none")
    p.add_argument("--json", metavar="FILE", help="write the results here")
    return p.parse_args(argv)


class Client:
    """HTTP/1.1 requests on fresh connections to one server (``Connection: close``), timed from the first byte
    sent to the last byte of the answer."""

    def __init__(self, url: str, token: str | None) -> None:
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.token = token

    async def request(self, method: str, path: str, body: bytes = b"", ctype: str = "") -> tuple[int, dict, bytes,
                                                                                                  float]:
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: close",
                f"Content-Length: {len(body)}"]
        if ctype:
            head.append(f"Content-Type: {ctype}")
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")
        t0 = time.perf_counter()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status = int((await reader.readline()).split()[1])
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            n = headers.get("content-length")
            data = await (reader.readexactly(int(n)) if n is not None else reader.read())
        finally:
            writer.close()
        return status, headers, data, time.perf_counter() - t0


def percentiles(values: list[float]) -> dict:
    """p50, p95, p99 and max of ``values`` (milliseconds), None where empty."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    v = sorted(values)
    at = lambda q: v[min(len(v) - 1, int(round(q * (len(v) - 1))))] * 1000  # noqa: E731
    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": v[-1] * 1000}


async def memory(client: Client) -> dict:
    """The server's resident memory from /metrics: its process and its workers' (bytes)."""
    status, _, text, _ = await client.request("GET", "/metrics")
    if status != 200:
        return {}
    found = {"server": 0, "workers": 0}
    for line in text.decode().splitlines():
        if m := re.match(r"minidet_server_resident_memory_bytes (\S+)", line):
            found["server"] = float(m.group(1))
        elif m := re.match(r"minidet_worker_resident_memory_bytes\{[^}]*\} (\S+)", line):
            found["workers"] += float(m.group(1))
    found["total"] = found["server"] + found["workers"]
    return found


class Phase:
    """One phase's answers: status counts, latencies of accepted (200) and refused (429) requests."""

    def __init__(self, name: str) -> None:
        self.name, self.statuses, self.ok, self.refused, self.other = name, {}, [], [], []
        self.serialize, self.model, self.t0, self.t1 = [], [], 0.0, 0.0

    def add(self, status: int, headers: dict, seconds: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        (self.ok if status == 200 else self.refused if status == 429 else self.other).append(seconds)
        if status == 200:
            stages = dict(re.findall(r"([\w.-]+);dur=([\d.]+)", headers.get("server-timing", "")))
            ms = {k: float(v) for k, v in stages.items()}
            self.serialize.append(ms.pop("serialize", 0.0))
            ms.pop("queue", None)
            ms.pop("decode", None)
            self.model.append(sum(ms.values()))

    def summary(self) -> dict:
        wall = max(self.t1 - self.t0, 1e-9)
        model = statistics.median(self.model) if self.model else None
        ser = statistics.median(self.serialize) if self.serialize else None
        return {"phase": self.name, "requests": sum(self.statuses.values()), "statuses": self.statuses,
                "seconds": wall, "throughput": len(self.ok) / wall, "accepted_ms": percentiles(self.ok),
                "refused_ms": percentiles(self.refused), "model_ms_median": model, "serialize_ms_median": ser}


async def send(client: Client, phase: Phase, path: str, image: tuple[bytes, str]) -> None:
    try:
        status, headers, _, seconds = await client.request("POST", path, image[0], image[1])
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        status, headers, seconds = 0, {}, 0.0  # the connection failed: counted as status 0
    phase.add(status, headers, seconds)


async def closed_loop(client: Client, path: str, images: list, concurrency: int, seconds: float, count: int,
                      name: str) -> Phase:
    """``concurrency`` requests in flight until ``seconds`` passed or ``count`` were sent."""
    phase, sent = Phase(name), 0
    phase.t0 = time.perf_counter()
    deadline = phase.t0 + seconds

    async def user():
        nonlocal sent
        while time.perf_counter() < deadline and sent < count:
            k = sent
            sent += 1
            await send(client, phase, path, images[k % len(images)])

    await asyncio.gather(*(user() for _ in range(concurrency)))
    phase.t1 = time.perf_counter()
    return phase


async def open_loop(client: Client, path: str, images: list, rate: float, count: int, name: str) -> Phase:
    """``count`` requests sent evenly at ``rate`` per second whatever the answers; waits for them (bounded)."""
    phase = Phase(name)
    phase.t0 = time.perf_counter()
    tasks = []
    for k in range(count):
        delay = phase.t0 + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(client, phase, path, images[k % len(images)])))
    done, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
    for t in pending:
        t.cancel()
        phase.add(-1, {}, DRAIN_S)  # never answered within the drain: counted as status -1
    phase.t1 = time.perf_counter()
    return phase


async def bench(args) -> dict:
    token = open(args.token_file).read().strip() if args.token_file else None
    client = Client(args.url, token)
    images = []
    for path in args.images:
        with open(path, "rb") as f:
            images.append((f.read(), mimetypes.guess_type(path)[0] or "image/jpeg"))
    path = "/predict" + (f"?{args.query}" if args.query else "")
    for _ in range(600):  # the model loads: up to 60 s
        try:
            if (await client.request("GET", "/health/ready"))[0] == 200:
                break
        except OSError:
            pass
        await asyncio.sleep(0.1)
    else:
        raise SystemExit(f"error: {args.url} is not ready after 60 s")
    _, _, meta, _ = await client.request("GET", "/v2")
    name = json.loads(meta)["models"][0]
    _, _, meta, _ = await client.request("GET", f"/v2/models/{urllib.parse.quote(name)}")
    workers = int(json.loads(meta).get("workers") or 1)
    result = {"url": args.url, "images": args.images, "workers": workers, "cpu": cpu_name(), "phases": []}

    def record(phase: Phase, mem_before: dict, mem_after: dict, **extra) -> dict:
        s = {**phase.summary(), **extra, "rss_before": mem_before, "rss_after": mem_after}
        result["phases"].append(s)
        print(line(s), flush=True)
        return s

    m0 = await memory(client)
    unloaded = record(await closed_loop(client, path, images, 1, 3600, args.unloaded, "unloaded"), m0,
                      await memory(client))
    m0 = await memory(client)
    cal = record(await closed_loop(client, path, images, workers, args.calibrate, 10**6, "sustainable"), m0,
                 await memory(client))
    rate = cal["throughput"]
    result["sustainable_rate"] = rate
    for factor in [float(x) for x in args.rates.split(",") if x.strip()]:
        m0 = await memory(client)
        phase = await open_loop(client, path, images, factor * rate, max(1, int(factor * rate * args.duration)),
                                f"{factor:g}x")
        record(phase, m0, await memory(client), rate=factor * rate)
    if args.soak:
        m0 = await memory(client)
        record(await open_loop(client, path, images, rate, args.soak, "soak"), m0, await memory(client), rate=rate)
    result["unloaded_p99_ms"] = unloaded["accepted_ms"]["p99"]
    return result


def cpu_name() -> str:
    """The CPU's model and the machine's logical cores: ``AMD EPYC (2 cores)``."""
    return f"{machine.cpu_model()} ({machine.cores()} cores)"


def line(s: dict) -> str:
    ok, bad = s["accepted_ms"], s["refused_ms"]
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    rss = lambda m: f"{m.get('total', 0) / 2**20:.0f}" if m else "-"  # noqa: E731
    rej = f"429: {s['statuses'].get(429, 0)} (p99 {fmt(bad['p99'])} ms)" if s["statuses"].get(429) else "429: 0"
    others = {k: v for k, v in s["statuses"].items() if k not in (200, 429)}
    return (f"{s['phase']:>11}: {s['requests']} requests in {s['seconds']:.1f} s, {s['throughput']:.2f}/s answered; "
            f"200 p50/p95/p99 {fmt(ok['p50'])}/{fmt(ok['p95'])}/{fmt(ok['p99'])} ms; {rej}"
            f"{'; other ' + str(others) if others else ''}; RSS {rss(s['rss_before'])} -> {rss(s['rss_after'])} MiB")


def main(argv: list[str] | None = None, prog: str = "minidet bench-serve") -> int:
    args = parse_args(argv, prog)
    print(f"bench-serve: {args.url}, {cpu_name()}", flush=True)
    result = asyncio.run(bench(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
