"""The bounded HTTP server behind the exporter and every metrics endpoint keeps serving (issue #18, exporter)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from kubegpu.errors import ConfigError
from kubegpu.httpserver import BACKLOG, BoundedWSGIServer, parse_listen_address, serve_wsgi
from kubegpu.metrics import serve_metrics


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]


@pytest.fixture
def server() -> Iterator[BoundedWSGIServer]:
    srv = serve_wsgi(_app, "127.0.0.1", 0, workers=4)
    yield srv
    srv.shutdown()
    srv.server_close()


def _request(port: int, method: str = "GET", timeout: float = 5.0) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, "/")
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()


def test_real_backlog() -> None:
    assert BoundedWSGIServer.request_queue_size == BACKLOG >= 512  # was 5: 50 scrapers overflowed it


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_get_and_head(server: BoundedWSGIServer, method: str) -> None:
    status, _body, headers = _request(server.server_port, method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_head_has_no_body(server: BoundedWSGIServer) -> None:
    assert _request(server.server_port, "HEAD")[:2] == (200, b"")
    assert _request(server.server_port, "GET")[:2] == (200, b"hello\n")


def test_idle_connections_do_not_hold_workers(server: BoundedWSGIServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(200)]  # 50x the pool
    try:
        started = time.monotonic()
        for _ in range(20):
            assert _request(server.server_port, timeout=2.0)[0] == 200
        assert time.monotonic() - started < 2.0
    finally:
        for sock in idle:
            sock.close()


def test_trickling_client_holds_one_worker_only_until_its_timeout(server: BoundedWSGIServer) -> None:
    slow = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(6)]
    for sock in slow:
        sock.sendall(b"GET / HTTP/1.1\r\n")  # then nothing: the request line arrived, the headers never do
    try:
        time.sleep(0.2)
        deadline = time.monotonic() + 8.0  # REQUEST_TIMEOUT_S (5 s) frees the workers
        while time.monotonic() < deadline:
            try:
                if _request(server.server_port, timeout=1.0)[0] == 200:
                    break
            except (TimeoutError, OSError):
                continue
        else:
            pytest.fail("workers never freed from trickling clients")
    finally:
        for sock in slow:
            sock.close()


def test_idle_connection_is_closed_after_idle_timeout() -> None:
    srv = BoundedWSGIServer(("127.0.0.1", 0), _app, workers=2, idle_timeout_s=0.3)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sock = socket.create_connection(("127.0.0.1", srv.server_port))
        sock.settimeout(5.0)
        assert sock.recv(1) == b""  # closed by the server, not by our timeout
        sock.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_concurrent_scrapers_all_succeed(server: BoundedWSGIServer) -> None:
    errors: list[BaseException] = []

    def scrape() -> None:
        for _ in range(10):
            try:
                assert _request(server.server_port)[0] == 200
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=scrape) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_serve_metrics_uses_the_bounded_server() -> None:
    registry = CollectorRegistry()
    Gauge("kubegpu_test_value", "a test gauge", registry=registry).set(3)
    port = serve_metrics("127.0.0.1:0", registry)
    status, body, _ = _request(port)
    assert status == 200 and b"kubegpu_test_value 3.0" in body
    assert _request(port, "POST")[0] == 405


@pytest.mark.parametrize("address,expected", [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)),
                                              ("[::1]:8080", ("::1", 8080))])
def test_listen_addresses(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(address, "--metrics-address") == expected


@pytest.mark.parametrize("address", ["9400", "host:", ":99999", "x:y"])
def test_bad_listen_address_is_one_line(address: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-address: expected HOST:PORT"):
        parse_listen_address(address, "--metrics-address")
