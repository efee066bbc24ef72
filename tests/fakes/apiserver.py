"""A Kubernetes API server for integration tests: kmock 0.8 + our compat layer, over real HTTP on loopback.

Use it to run real lightkube code (a `LightkubeCluster`) against an API server in a test::

    from tests.fakes.apiserver import start_apiserver

    server = start_apiserver()          # background thread, own event loop, a free 127.0.0.1 port
    cluster = server.cluster()          # a LightkubeCluster pointed at it (a fresh lightkube Client)
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    ...
    server.stop()

Most tests should take the session-scoped ``apiserver`` fixture from ``tests/conftest.py`` instead (it starts the
server once per test session): ``def test_x(apiserver): cluster = apiserver.cluster()``. Objects persist across tests
in a session, so use unique names (or call ``apiserver.reset()``).

What the server cannot do faithfully (kmock's gaps, reference/deps.md §1d): PUT, label/field selectors (ignored:
filter client-side or test selector logic on `MemoryCluster`), watch resume (a watch replays every existing object
as ADDED before live changes — start watches before creating the objects you expect events for, and give every
watch a timeout), strategic merge of lists (replaced), and ``/status`` isolation. ``timeoutSeconds`` works.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import yaml
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from kubegpu.kube.lightkube_cluster import LightkubeCluster
from tests.fakes.kmock_compat import CompatEmulator


@dataclass
class ApiServer:
    """A running emulated API server; ``url`` is its base URL, ``emulator`` the kmock object for assertions."""

    url: str
    emulator: CompatEmulator
    _loop: asyncio.AbstractEventLoop = field(repr=False)
    _stop: asyncio.Future[None] = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def client(self) -> Client:
        """A fresh lightkube sync Client configured for this server (token auth, no TLS)."""
        config = KubeConfig.from_one(cluster=Cluster(server=self.url), user=User(token="kubegpu-test"))
        return Client(config=config, trust_env=False)

    def cluster(self) -> LightkubeCluster:
        """A LightkubeCluster talking to this server."""
        return LightkubeCluster(self.client())

    def requests(self) -> list[Any]:
        """Every request the server received so far (kmock Request objects: ``.params``, ``.headers``, ``.data``)."""
        return list(self.emulator)

    def reset(self) -> None:
        """Forget every stored object (watch streams already open stay open)."""
        done = threading.Event()

        def clear() -> None:
            for key in list(self.emulator.objects):
                del self.emulator.objects[key]
            done.set()

        self._loop.call_soon_threadsafe(clear)
        done.wait(5)

    def stop(self) -> None:
        if not self._stop.done():
            self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)


def start_apiserver(host: str = "127.0.0.1", timeout: float = 10.0) -> ApiServer:
    """Start the emulated API server in a daemon thread with its own event loop; return once it accepts requests."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_serve(host, loop, state, ready))
        except BaseException as exc:  # reported to the starting thread below
            state["error"] = exc
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="kmock-apiserver", daemon=True)
    thread.start()
    if not ready.wait(timeout) or "error" in state:
        raise RuntimeError(f"emulated API server did not start: {state.get('error', 'timed out')}")
    return ApiServer(url=state["url"], emulator=state["emulator"], _loop=state["loop"], _stop=state["stop"],
                     _thread=thread)


async def _serve(host: str, loop: asyncio.AbstractEventLoop, state: dict[str, Any], ready: threading.Event) -> None:
    emulator = CompatEmulator()
    async with emulator, kmock.Server(emulator, host=host) as server:
        stop: asyncio.Future[None] = loop.create_future()
        state.update(url=f"http://{host}:{server.port}", emulator=emulator, loop=loop, stop=stop)
        ready.set()
        await stop


def write_kubeconfig(directory: Path, url: str) -> Path:
    """A kubeconfig file for the emulated API server, so CLI commands (which build their own client) reach it."""
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "kubegpu-test"}}],
        "contexts": [{"name": "test", "context": {"cluster": "emulated", "user": "tester"}}],
    }))
    return path
