"""Every HTTP endpoint keeps serving whatever other clients do: kubegpu.endpoints on aiohttp.

Quick versions of the slow-client cases in `benchmarks/exporter_scrape.py`: slow headers, silent connections, a
trickled request, a huge header, a flood past the connection cap — each beside honest scrapers that must all
succeed, quickly.
"""

from __future__ import annotations

import http.client
import logging
import resource
import socket
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from kubegpu.endpoints import FD_RESERVE, Endpoint, Limits, connection_cap, parse_listen_address, serve
from kubegpu.errors import ConfigError
from kubegpu.metrics import serve_metrics
from tests.fakes.hostile_clients import (
    FULL_REQUEST,
    HeldConnections,
    HugeHeader,
    Trickler,
    raise_fd_limit,
    scrape_load,
)

BODY = b"kubegpu_test_value 1.0\n" * 2000  # ~46 KiB, the size of a busy node's scrape


async def _metrics(request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(body=BODY, content_type="text/plain")


def _serve(limits: Limits | None = None) -> Endpoint:
    return serve({"/metrics": _metrics}, "127.0.0.1", 0, name="test-http", limits=limits)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    srv = _serve()
    yield srv
    srv.close()


def _request(port: int, method: str = "GET", path: str = "/metrics", host: str = "127.0.0.1",
             timeout: float = 5.0) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()


def _closed_by_server_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed `sock` (reading EOF or a reset); fails if it stays open `seconds`."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        pytest.fail(f"connection still open after {seconds} s")
    return time.monotonic() - started


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_get_and_head(endpoint: Endpoint, method: str) -> None:
    status, _body, headers = _request(endpoint.port, method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_head_has_the_get_headers_and_no_body(endpoint: Endpoint) -> None:
    status, body, headers = _request(endpoint.port, "HEAD")
    assert (status, body) == (200, b"") and headers["Content-Length"] == str(len(BODY))
    assert _request(endpoint.port, "GET")[:2] == (200, BODY)


def test_unknown_path_is_404(endpoint: Endpoint) -> None:
    assert _request(endpoint.port, path="/nothing-here")[0] == 404


def test_ipv6_listen() -> None:
    try:
        srv = serve({"/metrics": _metrics}, "::1", 0)
    except OSError as exc:  # a kernel without IPv6 (some CI containers): the listen flag is still parsed right
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert _request(srv.port, host="::1")[:2] == (200, BODY)
    finally:
        srv.close()


def test_silent_connection_is_closed_at_the_header_timeout() -> None:
    srv = _serve(Limits(header_timeout_s=0.5))
    try:
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            assert 0.3 < _closed_by_server_within(sock, 5.0) < 3.0
    finally:
        srv.close()


def test_trickled_header_does_not_extend_the_header_timeout() -> None:
    srv = _serve(Limits(header_timeout_s=0.6))
    try:
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            with pytest.raises(OSError):  # a slowloris client: a header line every 100 ms, forever
                for i in range(100):
                    sock.sendall(b"X-Slow-%d: y\r\n" % i)
                    time.sleep(0.1)
            assert time.monotonic() - started < 3.0
    finally:
        srv.close()


def test_keep_alive_connection_is_closed_when_idle() -> None:
    srv = _serve(Limits(header_timeout_s=0.5))
    try:
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 200 and response.read() == BODY
            assert 0.3 < _closed_by_server_within(sock, 5.0) < 3.0
    finally:
        srv.close()


def test_a_request_trickled_one_byte_per_100ms_is_answered(endpoint: Endpoint) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: k\r\n\r\n"  # 35 bytes: 3.5 s, inside the 10 s header timeout
    with Trickler("127.0.0.1", endpoint.port, request=request) as trickler:
        result = scrape_load("127.0.0.1", endpoint.port, scrapes=200, threads=20)
        deadline = time.monotonic() + 8.0
        while trickler.answered == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert trickler.statuses[:1] == [200]
    assert result.errors == [] and len(result.latencies) == 200


def test_a_1mib_header_is_refused_and_others_are_served(endpoint: Endpoint) -> None:
    with HugeHeader("127.0.0.1", endpoint.port) as huge:
        result = scrape_load("127.0.0.1", endpoint.port, scrapes=200, threads=20)
        time.sleep(0.3)
    assert huge.statuses and set(huge.statuses) <= {400, 0} and 400 in huge.statuses
    assert result.errors == [] and len(result.latencies) == 200


def test_too_many_headers_is_400(endpoint: Endpoint) -> None:
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5.0) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: y\r\n" % i for i in range(200))
                     + b"\r\n")
        assert sock.makefile("rb").readline().split()[1] == b"400"


def test_slow_header_connections_delay_no_scrape(endpoint: Endpoint) -> None:
    """The shape of the acceptance check, at a tenth of its size: slow-header connections held open beside
    concurrent scrapers. The hand-written server this replaced failed every scrape here."""
    with HeldConnections("127.0.0.1", endpoint.port, 200) as held:
        time.sleep(0.2)
        result = scrape_load("127.0.0.1", endpoint.port, scrapes=300, threads=30)
        assert endpoint.open_connections >= 200  # they really were held while the scrapes ran
    assert held.opened == 200
    assert result.errors == [] and len(result.latencies) == 300
    assert result.p99 < 2.0, f"p99 {result.p99 * 1000:.0f} ms"  # generous: the test machine is shared


def test_silent_connections_past_the_cap_close_the_longest_idle(caplog: pytest.LogCaptureFixture) -> None:
    raise_fd_limit(4096)
    srv = _serve(Limits(max_connections=100))
    try:
        with caplog.at_level(logging.WARNING, logger="kubegpu.endpoints"), \
                HeldConnections("127.0.0.1", srv.port, 300, opening=b"", reconnect=False) as held:
            time.sleep(0.3)
            result = scrape_load("127.0.0.1", srv.port, scrapes=200, threads=20)
            assert srv.open_connections <= 100
        assert held.opened == 300 and held.closed_by_server >= 200
        assert result.errors == [] and len(result.latencies) == 200
        lines = [r.getMessage() for r in caplog.records if "the cap" in r.getMessage()]
        assert lines and "100 open connections, the cap" in lines[0]
        assert len(lines) == 1  # one line, not one per connection closed
    finally:
        srv.close()


def test_connection_cap_stays_below_the_open_file_limit() -> None:
    cap = connection_cap(10**9)
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == resource.RLIM_INFINITY or cap == soft - FD_RESERVE
    assert connection_cap(50) == 50


def test_serve_metrics_serves_the_registry_on_the_bounded_server() -> None:
    registry = CollectorRegistry()
    Gauge("kubegpu_test_value", "a test gauge", registry=registry).set(3)
    port = serve_metrics("127.0.0.1:0", registry)
    status, body, _ = _request(port)
    assert status == 200 and b"kubegpu_test_value 3.0" in body
    assert _request(port, "POST")[0] == 405
    with socket.create_connection(("127.0.0.1", port)) as sock:  # the same request a raw client would send
        sock.sendall(FULL_REQUEST)
        assert b"kubegpu_test_value 3.0" in sock.makefile("rb").read()


def test_serve_metrics_on_a_taken_port_is_one_line() -> None:
    port = serve_metrics("127.0.0.1:0", CollectorRegistry())
    with pytest.raises(ConfigError, match=f"--metrics-address: cannot listen on 127.0.0.1:{port}: "):
        serve_metrics(f"127.0.0.1:{port}", CollectorRegistry())


@pytest.mark.parametrize("address,expected", [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)),
                                              ("[::1]:8080", ("::1", 8080))])
def test_listen_addresses(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(address, "--metrics-address") == expected


@pytest.mark.parametrize("address", ["9400", "host:", ":99999", "x:y"])
def test_bad_listen_address_is_one_line(address: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-address: expected HOST:PORT"):
        parse_listen_address(address, "--metrics-address")
