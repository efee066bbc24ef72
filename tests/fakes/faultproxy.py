"""An HTTP proxy in front of the emulated API server that injects the faults a real control plane produces.

Each proxied request, with probability `rate`, meets one fault instead of (or after) reaching the server:

- `429` / `500` / `503`: a Kubernetes Status error, the request never reaches the server;
- `drop-before`: the connection is closed without an answer, the request never reaches the server;
- `drop-after`: the request reaches the server (and takes effect), then the connection is closed without an answer
  — the ambiguous case: the client cannot tell whether its write happened.

Watch requests pass untouched. `faults` counts what was injected, per kind. Seeded, so a run repeats.
"""

from __future__ import annotations

import json
import random
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2

FAULT_KINDS = ("429", "500", "503", "drop-before", "drop-after")
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


class FaultProxy:
    def __init__(self, upstream: str, rate: float = 0.3, seed: int = 1,
                 kinds: tuple[str, ...] = FAULT_KINDS) -> None:
        self.upstream = upstream.rstrip("/")
        self.rate = rate
        self.kinds = kinds
        self.faults: Counter[str] = Counter()
        self.forwarded = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._client = httpx2.Client(timeout=30.0, trust_env=False)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle stall per answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def injected(self) -> int:
        return sum(self.faults.values())

    def _choose(self) -> str | None:
        with self._lock:
            if self._rng.random() >= self.rate:
                return None
            fault = self._rng.choice(self.kinds)
            self.faults[fault] += 1
            return fault

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        fault = None if "watch=" in handler.path else self._choose()
        if fault in ("429", "500", "503"):
            code = int(fault)  # type: ignore[arg-type]
            reason = {429: "TooManyRequests", 500: "InternalError"}.get(code, "ServiceUnavailable")
            payload = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                  "reason": reason, "message": f"injected {code}"}).encode()
            handler.send_response(code)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            if code == 429:
                handler.send_header("Retry-After", "0")
            handler.end_headers()
            handler.wfile.write(payload)
            return
        if fault == "drop-before":
            handler.close_connection = True
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_HEADERS}
        response = self._client.request(handler.command, self.upstream + handler.path, headers=headers, content=body)
        with self._lock:
            self.forwarded += 1
        if fault == "drop-after":
            handler.close_connection = True
            return
        data = response.content
        handler.send_response(response.status_code)
        for key, value in response.headers.items():
            if key.lower() not in _HOP_HEADERS:
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
