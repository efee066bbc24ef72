"""Every HTTP endpoint kubegpu listens on (exporter `/metrics` and `/health`, each component's `/metrics`), on aiohttp.

HTTP serving is not kubegpu's business, so a well-kept asynchronous server does it: aiohttp's low-level server,
chosen by measurement over uvicorn (README, "Serving under hostile clients") and already installed with kopf. One
event loop per endpoint, on its own daemon thread, holds every connection, so a client that is slow or silent costs
a file descriptor and a few KiB, never a thread or a worker another scrape waits for. What is bounded, per
connection and in total:

- **header-read and idle timeout** (`HEADER_TIMEOUT_S`): from the connection's start, and again from the end of each
  response, a complete request header must arrive within this time or the connection is closed. Bytes that trickle
  in do not extend it (aiohttp's keep-alive deadline is not reset by partial data), so a slowloris client is cut off
  like a silent one.
- **header size** (`MAX_LINE_SIZE`, `MAX_FIELD_SIZE`, `MAX_HEADERS`): a longer request line or header, or more
  headers, is answered 400 at once and the connection closed; what one connection can make us buffer is bounded.
- **open connections** (`MAX_CONNECTIONS`, and never more than the open-file limit allows): when a new connection
  would pass the cap, the connection that has waited longest without a request in progress is closed, with one log
  line (at most every `CAP_LOG_EVERY_S`), so a flood of idle connections can never lock out the next scrape.
- **methods**: GET and HEAD only (405 with `Allow: GET, HEAD` otherwise): these endpoints are read-only.

The listen flags keep their dcgm-exporter-compatible spelling (`:9400`, `0.0.0.0:9400`, `[::]:9400`):
`parse_listen_address`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kubegpu.errors import ConfigError

__all__ = ["Endpoint", "Handler", "Limits", "parse_listen_address", "serve"]

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
MAX_LINE_SIZE = 8190
MAX_FIELD_SIZE = 8190
MAX_HEADERS = 32
MAX_CONNECTIONS = 1024
BACKLOG = 1024
FD_RESERVE = 64  # descriptors the rest of the process keeps (files, the API client, the kubelet's sockets)
CAP_LOG_EVERY_S = 10.0
ALLOWED_METHODS = ("GET", "HEAD")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    max_line_size: int = MAX_LINE_SIZE
    max_field_size: int = MAX_FIELD_SIZE
    max_headers: int = MAX_HEADERS


def parse_listen_address(address: str, flag: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """`:9400`, `0.0.0.0:9400`, `[::]:9400` or `127.0.0.1:0` → (host, port); an empty host is `default_host`."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{flag}: expected HOST:PORT such as ':9400', got {address!r}")
    host = host.strip("[]") if host.startswith("[") else host
    return host or default_host, int(port_text)


def connection_cap(wanted: int) -> int:
    """`wanted`, lowered to what the open-file limit leaves once the soft limit is raised to the hard one.

    Go programs (dcgm-exporter among them) raise the soft limit at start; so do we, so a default soft limit of 1024
    is not what a flood of connections runs into. Past the limit, accept() fails and asyncio stops accepting for a
    second, which would stall every scrape: the cap keeps us below it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, int(soft) - FD_RESERVE))


class _QuietBadRequests(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger: a malformed or oversized request is one debug line, not an error traceback (a
    hostile client must not fill the log); a failure of our own handler stays an error with its traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.logger.debug("bad request from %s: %s", args[0] if args else "?",
                              " ".join(str(exc_info).split()))
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


class _BoundedServer(web.Server):
    """aiohttp's low-level server with a cap on open connections (the longest-idle one goes when it is reached)."""

    def __init__(self, handler: Handler, *, cap: int, name: str, **kwargs: Any) -> None:
        super().__init__(self._track, **kwargs)
        self._route = handler
        self._cap = cap
        self._name = name
        self._active: dict[Any, asyncio.Transport] = {}  # protocol → transport, oldest activity first
        self._busy: set[Any] = set()
        self._closed_at_cap = 0
        self._last_cap_log = float("-inf")

    @property
    def open_connections(self) -> int:
        return len(self._active)

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._active[handler] = transport
        if len(self._active) > self._cap:
            self._close_longest_idle(handler)

    def connection_lost(self, handler: Any, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._active.pop(handler, None)
        self._busy.discard(handler)

    def _close_longest_idle(self, newcomer: Any) -> None:
        victim = next((h for h in self._active if h not in self._busy and h is not newcomer), newcomer)
        transport = self._active.pop(victim)
        peer = transport.get_extra_info("peername")
        transport.abort()
        self._closed_at_cap += 1
        now = asyncio.get_running_loop().time()
        if now - self._last_cap_log >= CAP_LOG_EVERY_S:
            log.warning("%s: %d open connections, the cap: closing the longest-idle ones so new clients are served "
                        "(%d closed since the last message, latest from %s)",
                        self._name, self._cap, self._closed_at_cap, peer[0] if peer else "?")
            self._last_cap_log = now
            self._closed_at_cap = 0

    async def _track(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        transport = self._active.pop(protocol, None)
        if transport is not None:
            self._active[protocol] = transport  # most recently active: the last to be closed at the cap
        self._busy.add(protocol)
        try:
            if request.method not in ALLOWED_METHODS:
                return web.Response(status=405, text="method not allowed\n", headers={"Allow": "GET, HEAD"})
            return await self._route(request)
        finally:
            self._busy.discard(protocol)


class Endpoint:
    """A running endpoint: `port` is where it listens (port 0 picked a free one); `close()` stops it."""

    def __init__(self, routes: Mapping[str, Handler], default: Handler | None, host: str, port: int, name: str,
                 limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self.cap = connection_cap(limits.max_connections)
        self._routes = dict(routes)
        self._default = default
        self._loop = asyncio.new_event_loop()
        self._server: _BoundedServer | None = None
        self._listener: asyncio.Server | None = None
        started: Future[int] = Future()
        self._thread = threading.Thread(target=self._run, args=(host, port, started), name=name, daemon=True)
        self._thread.start()
        self.port = started.result()  # a bind error is raised here, in the caller

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        handler = self._routes.get(request.path, self._default)
        if handler is None:
            return web.Response(status=404, text="not found\n")
        return await handler(request)

    async def _start(self, host: str, port: int) -> int:
        self._server = _BoundedServer(
            self._dispatch, cap=self.cap, name=self.name, keepalive_timeout=self.limits.header_timeout_s,
            max_line_size=self.limits.max_line_size, max_field_size=self.limits.max_field_size,
            max_headers=self.limits.max_headers, access_log=None,
            logger=_QuietBadRequests(logging.getLogger("aiohttp.server"), {}),
        )
        self._listener = await self._loop.create_server(self._server, host, port, backlog=BACKLOG,
                                                        reuse_address=True)
        return int(self._listener.sockets[0].getsockname()[1])

    def _run(self, host: str, port: int, started: Future[int]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            started.set_result(self._loop.run_until_complete(self._start(host, port)))
        except BaseException as exc:
            started.set_exception(exc)
            self._loop.close()
            return
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    @property
    def open_connections(self) -> int:
        return self._server.open_connections if self._server is not None else 0

    async def _stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(timeout=1.0)
        if self._listener is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._listener.wait_closed(), timeout=1.0)

    def close(self) -> None:
        """Stop listening, close every connection, end the thread; safe to call twice."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=5.0)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)


def serve(routes: Mapping[str, Handler], host: str, port: int, *, name: str = "kubegpu-http",
          default: Handler | None = None, limits: Limits | None = None) -> Endpoint:
    """Listen on host:port and serve `routes` (path → handler; other paths go to `default`, or 404) from a daemon
    thread. Raises OSError when it cannot bind; callers turn that into a one-line error naming their flag."""
    return Endpoint(routes, default, host, port, name, limits or Limits())
