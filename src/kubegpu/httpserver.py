"""The one HTTP server behind every kubegpu endpoint (exporter `/metrics`, component metrics): it keeps serving.

The standard library's servers, as prometheus_client and wsgiref use them, listen with a backlog of 5, start one
thread per connection and never time a connection out: 50 concurrent scrapers queue for seconds and a few hundred
silent connections pin a few hundred threads forever. This server instead

- listens with a real backlog (`BACKLOG`);
- parks accepted connections in a waiting room (one selector thread) until the first request bytes arrive, so idle
  or slow-to-start clients cost a file descriptor, not a worker; the room is bounded (`MAX_WAITING`, oldest dropped)
  and each connection is closed after `IDLE_TIMEOUT_S` without a request;
- runs requests on a fixed worker pool (`WORKERS`), each socket with a read/write timeout (`REQUEST_TIMEOUT_S`),
  so a client that trickles its headers holds one worker for at most that long;
- answers only GET and HEAD (405 with `Allow` otherwise) — these endpoints are read-only.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from kubegpu.errors import ConfigError

__all__ = ["BoundedWSGIServer", "WsgiApp", "only_get_and_head", "parse_listen_address", "serve_wsgi"]

log = logging.getLogger(__name__)

BACKLOG = 1024
WORKERS = 8
MAX_WAITING = 1024
IDLE_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 5.0

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def parse_listen_address(address: str, flag: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """`:9400`, `0.0.0.0:9400`, `[::]:9400` or `127.0.0.1:0` → (host, port); an empty host is `default_host`."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{flag}: expected HOST:PORT such as ':9400', got {address!r}")
    host = host.strip("[]") if host.startswith("[") else host
    return host or default_host, int(port_text)


def only_get_and_head(app: WsgiApp) -> WsgiApp:
    """405 for anything but GET and HEAD; HEAD gets the GET headers and no body."""

    def wrapped(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        body = app(environ, start_response)
        if method == "HEAD":
            close = getattr(body, "close", None)
            if close is not None:
                close()
            return []
        return body

    return wrapped


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler applies it to the socket: reads and writes both

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):  # headers and body go out as separate writes: no 40 ms Nagle stall
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)


class BoundedWSGIServer(WSGIServer):
    """A WSGI server with a real backlog, an idle-connection waiting room and a fixed worker pool."""

    request_queue_size = BACKLOG
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: WsgiApp, workers: int = WORKERS,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, name: str = "kubegpu-http") -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.set_app(only_get_and_head(app))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-worker")
        self._idle_timeout_s = idle_timeout_s
        self._selector = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, tuple[Any, float]] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closed = False
        self._room = threading.Thread(target=self._watch, name=f"{name}-idle", daemon=True)
        self._room.start()

    # socketserver calls this for every accepted connection, on the accept thread: park it, never block here
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._waiting) >= MAX_WAITING:
                oldest = min(self._waiting, key=lambda s: self._waiting[s][1])
                self._drop(oldest)
            self._waiting[request] = (client_address, time.monotonic())
            self._selector.register(request, selectors.EVENT_READ)
        self._wake_w.send(b"x")

    def _drop(self, sock: socket.socket) -> None:
        self._waiting.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(sock)
        self.shutdown_request(sock)

    def _watch(self) -> None:
        """The waiting room: hand a connection to the pool once it has bytes to read; drop it when idle too long."""
        while not self._closed:
            try:
                events = self._selector.select(timeout=1.0)
            except (OSError, ValueError):
                if self._closed:
                    return
                continue
            ready: list[tuple[socket.socket, Any]] = []
            with self._lock:
                for key, _mask in events:
                    sock = key.fileobj
                    if sock is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        continue
                    assert isinstance(sock, socket.socket)
                    entry = self._waiting.pop(sock, None)
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        self._selector.unregister(sock)
                    if entry is not None:
                        ready.append((sock, entry[0]))
                deadline = time.monotonic() - self._idle_timeout_s
                for sock in [s for s, (_, since) in self._waiting.items() if since < deadline]:
                    self._drop(sock)
            for sock, address in ready:
                try:
                    self._pool.submit(self._work, sock, address)
                except RuntimeError:  # pool shut down
                    self.shutdown_request(sock)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            log.debug("request from %s failed", client_address, exc_info=True)
        finally:
            self.shutdown_request(request)

    def server_close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        super().server_close()
        self._room.join(timeout=2.0)
        with self._lock:
            for sock in list(self._waiting):
                self._drop(sock)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


def serve_wsgi(app: WsgiApp, host: str, port: int, *, name: str = "kubegpu-http",
               workers: int = WORKERS) -> BoundedWSGIServer:
    """Bind (port 0 picks a free one) and serve from a daemon thread; `shutdown()` then `server_close()` to stop."""
    server = BoundedWSGIServer((host, port), app, workers=workers, name=name)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
