"""The running DRA driver: serve the kubelet, publish the node's slices, and follow GPU health.

Every `interval` it reads new XID events: a critical XID taints that GPU's devices (NoExecute for fatal XIDs,
NoSchedule otherwise); a GPU with no critical XID for `quiet_period` loses its taint. Slices are rebuilt from the
driver's current offer (which tracks MIG devices made by claims) and published only when they changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from kubegpu.clock import Clock, RealClock
from kubegpu.dra.driver import DraDriver
from kubegpu.dra.publish import SlicePublisher
from kubegpu.dra.server import DraPluginServer
from kubegpu.dra.slices import GpuHealth, build_slices
from kubegpu.gpu.xid import is_critical

log = logging.getLogger("kubegpu.dra")
DEFAULT_QUIET_PERIOD_S = 300.0


@dataclass
class HealthState:
    """GPU index → (last critical XID, when); pure bookkeeping."""

    quiet_period_s: float = DEFAULT_QUIET_PERIOD_S
    unhealthy: dict[int, tuple[int, float]] = field(default_factory=dict)

    def observe(self, events: list[tuple[int, int, float]]) -> None:
        for gpu_index, xid, at in events:
            if is_critical(xid):
                self.unhealthy[gpu_index] = (xid, at)

    def recover(self, now: float) -> None:
        for index, (_, at) in list(self.unhealthy.items()):
            if now - at >= self.quiet_period_s:
                del self.unhealthy[index]

    def taints(self) -> dict[int, GpuHealth]:
        return {index: GpuHealth(xid) for index, (xid, _) in self.unhealthy.items()}


class DraAgent:
    def __init__(self, driver: DraDriver, server: DraPluginServer, publisher: SlicePublisher | None,
                 clock: Clock | None = None, quiet_period_s: float = DEFAULT_QUIET_PERIOD_S,
                 layout: str = "split") -> None:
        self.driver = driver
        self.server = server
        self.publisher = publisher
        self.clock = clock or RealClock()
        self.health = HealthState(quiet_period_s)
        self.layout = layout
        self._since = self.clock.now()

    def slices(self) -> list[dict[str, object]]:
        return build_slices(self.driver.node_name, self.driver.offers, self.health.taints(),
                            driver=self.driver.driver_name, layout=self.layout)

    def step(self) -> int | None:
        """One health check and publication; the new pool generation when the slices changed."""
        events = self.driver.backend.xid_events(self._since)
        if events:
            self._since = max(e.timestamp for e in events)
        self.health.observe([(e.gpu_index, e.xid, e.timestamp) for e in events])
        self.health.recover(self.clock.now())
        self.driver.resync()
        if self.publisher is None:
            return None
        generation = self.publisher.publish(self.slices())  # type: ignore[arg-type]
        if generation is not None:
            log.info("published ResourceSlices for %s, pool generation %d", self.driver.node_name, generation)
        return generation

    async def run(self, stop: asyncio.Event, interval: float = 5.0) -> None:
        await self.server.start()
        watcher = asyncio.create_task(self.server.watch())
        try:
            while not stop.is_set():
                await asyncio.to_thread(self.step)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
        finally:
            watcher.cancel()
            await self.server.stop()
