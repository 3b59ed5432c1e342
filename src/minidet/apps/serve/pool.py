"""The workers of ``minidet serve`` behind one bounded queue (:class:`Pool`).

Each worker process (``worker.worker_main``) has a thread here that takes the next request from the queue, hands it
to its process and hands the answer back to the event loop. A request that finds the queue full is refused at once
(:class:`QueueFull`: the server's 429); one that waited longer than the timeout is dropped before any model sees it;
one whose worker dies while running it is answered with an error, and a new worker takes the dead one's place; one
handed to a worker that died before it said it started it (``protocol.Started``) goes back to the queue, for the next
worker (its replacement, at worst).

A worker counts as ready (:attr:`Pool.ready_workers`, ``/health/ready``) from the moment it said it is ready and its
thread takes requests to the moment its process ends: a request sent while one is ready is served."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait as ended

from minidet.apps.serve.protocol import STOP, Answer, Failed, Ready, Request, ServerError, Timeout
from minidet.apps.serve.worker import Spec, worker_main

_STOP = object()  # put once per worker thread when the pool closes
RESTART_PAUSE_S = 1.0  # between failed starts of a replacement worker
IDLE_CHECK_S = 1.0  # how often an idle worker's thread checks that its process is alive
STOP_WAIT_S = 2.0  # at close, how long a worker may take to finish its request and exit before it is killed
NOT_RUN = "the server stopped before a worker took this request; it was not run"


class QueueFull(Exception):
    """The queue holds ``--max-queue`` waiting requests already."""


@dataclass
class Job:
    """One request in the pool: what its worker is sent (``request``: the image's bytes and options), when it was
    queued, the future the event loop awaits (its ``protocol.Answer``). ``started``/``dropped`` (under ``lock``):
    whether a worker took it, whether its waiter gave up first."""

    request: Request
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    dropped: bool = False
    waited: float = 0.0  # seconds in the queue, once a worker took it
    released: bool = False  # no longer counted by the pool's admission (Pool.release)

    def take(self) -> bool:
        """Called by the worker thread that takes the job: False if its waiter gave up on it already."""
        with self.lock:
            if self.dropped:
                return False
            self.started = True
            self.waited = time.monotonic() - self.queued
            return True

    def drop(self) -> bool:
        """Called by the waiter that gives up: True if no worker took the job (it never will)."""
        with self.lock:
            if self.started:
                return False
            self.dropped = True
            return True

    def resolve(self, result: Answer) -> None:
        """Hand ``result`` to the waiter (from any thread; nothing when the server's event loop is gone)."""
        def settle():
            if not self.future.done():
                self.future.set_result(result)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: the server stopped, nobody waits
            pass

    def untake(self) -> None:
        """Called by the worker thread that took the job and could not hand it over (its process was dead): the
        job waits for a worker again, and its waiter may give up on it."""
        with self.lock:
            self.started = False


class Pool:
    """``n`` worker processes built from ``spec`` (each with its own model), a queue of at most ``max_queue`` waiting
    requests; a request that waited more than ``timeout`` seconds (0: no limit) is answered ``protocol.Timeout``
    instead of being run. ``on_ready(facts)`` is called once the first worker is warmed up,
    ``on_fatal(line)`` when the first worker cannot load the model (a bad config or checkpoint: every worker would
    fail alike), ``on_restart(line)`` when a worker died or a replacement failed to start."""

    def __init__(self, spec: Spec, n: int, max_queue: int, timeout: float = 0.0,
                 on_ready: Callable[[dict], None] | None = None, on_fatal: Callable[[str], None] | None = None,
                 on_restart: Callable[[str], None] | None = None):
        self.spec, self.n, self.timeout = spec, n, timeout
        self.max_queue = max_queue
        self.queue: queue.Queue = queue.Queue()  # admission is submit's: at most max_queue wait beyond those running
        self._pending = 0  # admitted and not answered (waiting or running)
        self.on_ready, self.on_fatal, self.on_restart = on_ready, on_fatal, on_restart
        self.facts: dict | None = None  # the first ready worker's (model, classes, config)
        self._up: set[int] = set()  # the slots whose worker said ready, until their thread finds it dead or stops it
        self.started_all = False  # every slot's first worker warmed up (or failed to start)
        self.restarts = 0
        self.pids: dict[int, int] = {}  # worker slot -> process id
        self._procs: dict[int, multiprocessing.process.BaseProcess] = {}  # worker slot -> its process
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._ctx = multiprocessing.get_context("spawn")  # the server has threads: never fork it
        self._closing = False
        self._tried: set[int] = set()  # the slots whose first worker said ready or failed

    @property
    def ready_workers(self) -> int:
        """The workers that take requests now: each said it is ready, and its process has not ended (an end is seen
        here at once, before its thread finds it at the next request or idle check)."""
        with self._lock:
            procs = [self._procs[slot] for slot in self._up]
        return len(procs) - len(ended([p.sentinel for p in procs], timeout=0)) if procs else 0

    def readiness(self) -> tuple[bool, int]:
        """Whether requests are served (every slot's first worker warmed up or failed, and one is ready now), and how
        many workers are ready, read once."""
        n = self.ready_workers
        return self.started_all and n > 0, n

    @property
    def ready(self) -> bool:
        return self.readiness()[0]

    def start(self) -> None:
        """Start every worker (in the background: each thread loads its process's model)."""
        for slot in range(self.n):
            t = threading.Thread(target=self._serve, args=(slot,), name=f"minidet-worker-{slot}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, job: Job) -> None:
        """Queue ``job``; :class:`QueueFull` at once when ``max_queue`` requests wait already beyond one running on
        each ready worker (counted as admitted and not yet answered: a worker that is between two requests does not
        make a waiting one look like two)."""
        running = self.ready_workers
        with self._lock:
            if self._pending >= self.max_queue + running:
                raise QueueFull
            self._pending += 1
        self.queue.put(job)

    def release(self, job: Job) -> None:
        """``job`` no longer counts as admitted (answered, or given up by its waiter); once per job."""
        with self._lock:
            if not job.released:
                job.released = True
                self._pending -= 1

    def close(self, wait: float = STOP_WAIT_S) -> None:
        """Stop every worker. The server calls it once its requests are answered or its grace is over: a request
        still queued is answered 503 and never run; a worker still running one has ``wait`` seconds to finish and
        exit, then it is killed (so is one still loading its model)."""
        self._closing = True
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP and job.drop():
                job.resolve(ServerError(NOT_RUN, 503))
                self.release(job)
        for _ in self._threads:
            self.queue.put(_STOP)
        deadline = time.monotonic() + wait
        for proc in list(self._procs.values()):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for t in self._threads:
            t.join(max(0.5, deadline - time.monotonic()))

    # ------------------------------------------------------------------------------------------------------------

    def _spawn(self, slot: int):
        """A started worker process and the pipe to it, once it said it is ready; None if it failed (reported)."""
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=worker_main, args=(theirs, self.spec), name=f"minidet-serve-{slot}",
                                 daemon=True)
        proc.start()
        self._procs[slot] = proc
        theirs.close()
        try:
            said = ours.recv()
        except (EOFError, OSError):
            proc.join(5)
            said = Failed(f"the worker process ended while loading the model (exit code {proc.exitcode})")
        if not isinstance(said, Ready):
            proc.join(5)
            ours.close()
            self._tried_once(slot)
            if self._closing:  # killed by close while loading
                return None
            first = self.facts is None
            if first and self.on_fatal is not None:
                self.on_fatal(said.line)
            elif self.on_restart is not None:
                self.on_restart(f"worker {slot} failed to start: {said.line}")
            return None
        self.pids[slot] = proc.pid
        with self._lock:
            self._up.add(slot)
            first = self.facts is None
            if first:
                self.facts = said.facts
        self._tried_once(slot)
        if first and self.on_ready is not None:
            self.on_ready(said.facts)
        return proc, ours

    def _tried_once(self, slot: int) -> None:
        with self._lock:
            self._tried.add(slot)
            self.started_all = len(self._tried) == self.n

    def _serve(self, slot: int) -> None:
        """The thread of worker ``slot``: start its process, then feed it requests; replace it when it dies."""
        while not self._closing:
            worker = self._spawn(slot)
            if worker is None:
                if self.facts is None or self._closing:  # the model cannot be loaded at all: the server stops
                    return
                time.sleep(RESTART_PAUSE_S)
                continue
            proc, conn = worker
            died = self._feed(slot, proc, conn)
            if not died:
                return
            self.restarts += 1

    def _down(self, slot: int) -> None:
        """The worker of ``slot`` no longer counts as ready (before any answer about its end goes out)."""
        with self._lock:
            self._up.discard(slot)

    def _feed(self, slot: int, proc, conn) -> bool:
        """Hand requests to the worker until the pool closes (True: the worker died, start another)."""
        while True:
            try:
                job = self.queue.get(timeout=IDLE_CHECK_S)
            except queue.Empty:
                if proc.is_alive():
                    continue
                return self._died(slot, proc, conn)
            if job is _STOP:
                self._down(slot)
                try:
                    conn.send(STOP)
                except OSError:
                    pass
                return False
            waited = time.monotonic() - job.queued
            if self.timeout and waited > self.timeout:
                if job.drop():
                    job.resolve(Timeout(waited))
                self.release(job)
                continue
            if not job.take():
                self.release(job)
                continue
            try:
                if not proc.is_alive():
                    raise BrokenPipeError
                conn.send(job.request)
                conn.recv()  # protocol.Started: from now on the worker's death may be this request's doing
            except (EOFError, OSError):  # it died before it had the request: never run, the next worker takes it
                return self._died(slot, proc, conn, job)
            try:
                result = conn.recv()
            except (EOFError, OSError):
                return self._died(slot, proc, conn, job, running=True)
            job.resolve(result)
            self.release(job)

    def _died(self, slot: int, proc, conn, job: Job | None = None, running: bool = False) -> bool:
        """The worker of ``slot`` ended. It stops counting as ready first; then ``job``, the request it was handed
        (None: none), is answered 500 if the worker had started it (``running``: it may have died of it, and is never
        run again), or waits for the next worker if not (503 either way when the pool is closing). True: start
        another."""
        self._down(slot)
        proc.join(5)
        conn.close()
        code = proc.exitcode
        if job is not None and (running or self._closing):
            if self._closing:
                job.resolve(ServerError("the server stopped before this request's worker answered it" if running
                                        else NOT_RUN, 503))
            else:
                job.resolve(ServerError(f"the worker running this request died (exit code {code}); a new worker is "
                                        "starting"))
            self.release(job)
        elif job is not None:
            job.untake()
            self.queue.put(job)
        if self.on_restart is not None and not self._closing:
            how = f"died with exit code {code}" if running else f"died while idle (exit code {code})"
            self.on_restart(f"worker {slot} (pid {proc.pid}) {how}; starting another")
        return not self._closing
