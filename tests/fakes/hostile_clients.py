"""Hostile HTTP clients and a scrape load beside them, for the slow-client tests and `benchmarks/exporter_scrape.py`.

What a hostile network does to an endpoint: connections that send part of a request header and then wait
(slowloris), connections that send nothing at all, a request trickled one byte at a time, a header far larger than
any real one. Each runs from one background thread (a selector, so thousands of connections cost no threads) and
keeps its pressure up for as long as it runs: a connection the server closes is opened again. `scrape_load` is the
honest client beside them: N threads, each scrape on a new connection, latency and errors recorded.
"""

from __future__ import annotations

import contextlib
import http.client
import resource
import selectors
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

SLOW_HEADER = b"GET /metrics HTTP/1.1\r\nHost: kubegpu\r\nX-Slow: "
FULL_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: kubegpu\r\nConnection: close\r\n\r\n"


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft open-file limit towards `wanted` (as far as the hard limit allows); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return int(soft)


@dataclass
class HeldConnections:
    """`count` connections to (host, port), each sending `opening` and then nothing; reopened when closed.

    `reconnect=False` opens them once (the silent case measures what held sockets cost, not a reconnect storm).
    """

    host: str
    port: int
    count: int
    opening: bytes = SLOW_HEADER
    reconnect: bool = True
    opened: int = 0
    closed_by_server: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def _open(self, selector: selectors.BaseSelector) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=5.0)
            if self.opening:
                sock.sendall(self.opening)
        except OSError:
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.count):
                if self._stop.is_set():
                    break
                self._open(selector)
            self._ready.set()
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if data:
                        continue  # an error page: keep reading until the server closes
                    selector.unregister(sock)
                    sock.close()
                    self.closed_by_server += 1
                    if self.reconnect and not self._stop.is_set():
                        self._open(selector)
            for key in list(selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]

    def __enter__(self) -> HeldConnections:
        self._thread = threading.Thread(target=self._run, name="hostile-held", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=120)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


@dataclass
class Trickler:
    """One request at a time, sent one byte per `interval_s`; counts requests answered and how."""

    host: str
    port: int
    interval_s: float = 0.1
    request: bytes = FULL_REQUEST
    answered: int = 0
    statuses: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection((self.host, self.port), timeout=30.0) as sock:
                    for byte in self.request:
                        if self._stop.wait(self.interval_s):
                            return
                        sock.sendall(bytes([byte]))
                    status_line = sock.makefile("rb").readline()
            except OSError:
                status_line = b""
            parts = status_line.split()
            self.statuses.append(int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0)
            self.answered += 1

    def __enter__(self) -> Trickler:
        self._thread = threading.Thread(target=self._run, name="hostile-trickle", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


@dataclass
class HugeHeader:
    """Sends requests with one header of `size` bytes, over and over; records the status each got (0: none)."""

    host: str
    port: int
    size: int = 1 << 20
    statuses: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        head = b"GET /metrics HTTP/1.1\r\nHost: kubegpu\r\nX-Huge: "
        chunk = b"a" * 65536
        while not self._stop.is_set():
            status = 0
            try:
                with socket.create_connection((self.host, self.port), timeout=10.0) as sock:
                    sock.sendall(head)
                    with contextlib.suppress(OSError):  # the server may answer and close before it has it all
                        for _ in range(self.size // len(chunk)):
                            sock.sendall(chunk)
                        sock.sendall(b"\r\n\r\n")
                    parts = sock.makefile("rb").readline().split()
                    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            except OSError:
                pass
            self.statuses.append(status)
            self._stop.wait(0.05)

    def __enter__(self) -> HugeHeader:
        self._thread = threading.Thread(target=self._run, name="hostile-huge", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)


@dataclass
class ScrapeResult:
    latencies: list[float]
    errors: list[str]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("inf")

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("inf")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def scrape_load(host: str, port: int, scrapes: int, threads: int, path: str = "/metrics",
                timeout_s: float = 10.0) -> ScrapeResult:
    """`scrapes` GETs of `path` from `threads` threads, each on a new connection; latency of each, and every error."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    remaining = iter(range(scrapes))

    def take() -> bool:
        with lock:
            return next(remaining, None) is not None

    def worker() -> None:
        while take():
            started = time.perf_counter()
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            try:
                conn.request("GET", path)
                response = conn.getresponse()
                body = response.read()
                elapsed = time.perf_counter() - started
                with lock:
                    if response.status != 200 or not body:
                        errors.append(f"status {response.status}")
                    else:
                        latencies.append(elapsed)
            except OSError as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                conn.close()

    workers = [threading.Thread(target=worker, name=f"scraper-{i}", daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return ScrapeResult(latencies, errors)


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield None
