"""What ``GET /metrics`` shows (Prometheus text; every name starts with ``minidet_``): requests by endpoint and
status, rejections by reason, the queue's depth, the workers (ready, restarted, resident memory), and the time of
each stage as minidet's stage timer measures it, with decoding, the wait in the queue, serialization and the
whole request; bytes sent."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# seconds: from a fast stage on a GPU to a slow image on a CPU
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (0 where /proc does not tell)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


class _PoolCollector:
    """The pool's state, read when scraped."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def collect(self):
        pool = self.pool
        yield GaugeMetricFamily("minidet_queue_depth", "Requests waiting for a worker", value=pool.queue.qsize())
        yield GaugeMetricFamily("minidet_workers_ready", "Worker processes ready to run a request",
                                value=pool.ready_workers)
        yield CounterMetricFamily("minidet_worker_restarts", "Worker processes that died and were replaced",
                                  value=pool.restarts)
        rss = GaugeMetricFamily("minidet_worker_resident_memory_bytes", "Resident memory of each worker process",
                                labels=["worker"])
        for slot, pid in sorted(pool.pids.items()):
            rss.add_metric([str(slot)], resident_bytes(pid))
        yield rss
        yield GaugeMetricFamily("minidet_server_resident_memory_bytes", "Resident memory of the server process",
                                value=resident_bytes(os.getpid()))


class Metrics:
    """The server's metrics in a registry of their own."""

    def __init__(self, pool) -> None:
        disable_created_metrics()  # no *_created series beside each counter (the server process's choice)
        r = self.registry = CollectorRegistry()
        self.requests = Counter("minidet_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.rejections = Counter("minidet_rejections", "Requests refused or given up before a model answered "
                                  "them, by reason (queue_full: 429; timeout: waited past --timeout; host: a Host "
                                  "not the server's; client_gone: the upload broke off; stopping: not answered "
                                  "within the shutdown's --grace; header_timeout: a connection closed for sending "
                                  "no complete request head within --header-timeout)", ["reason"], registry=r)
        self.stage = Histogram("minidet_stage_seconds", "Seconds per stage of a request's forward (minidet's stage "
                               "timer), and decoding", ["stage"], buckets=BUCKETS, registry=r)
        self.serialization = Histogram("minidet_serialization_seconds", "Seconds to make a request's JSON (RLE "
                                       "included)", buckets=BUCKETS, registry=r)
        self.queue_wait = Histogram("minidet_queue_wait_seconds", "Seconds a request waited for a worker",
                                    buckets=BUCKETS, registry=r)
        self.latency = Histogram("minidet_request_seconds", "Seconds from a /predict request's arrival to its "
                                 "answer, as the server sees them", ["status"], buckets=BUCKETS, registry=r)
        self.bytes_out = Counter("minidet_response_bytes", "Bytes of /predict answers sent", registry=r)
        r.register(_PoolCollector(pool))

    def observe_times(self, times: dict[str, float]) -> None:
        """A worker's seconds by stage (``serialize`` to its own histogram)."""
        for stage, seconds in times.items():
            if stage == "serialize":
                self.serialization.observe(seconds)
            else:
                self.stage.labels(stage).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
