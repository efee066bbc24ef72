"""The autoscaler: provider tick, NodeClaim lifecycle, provisioning, termination and disruption in one step.

`Autoscaler.step()` is one synchronous pass over the cluster interface, so the same code runs under `kubegpu
autoscaler` (real clock, a loop with `run()`) and in the simulator (virtual clock, one step per tick). With a
`LeaderElector` (the command always has one) a pass first holds the `kubegpu-autoscaler` Lease, so several replicas
can run and only one provisions or disrupts: two acting at once would each buy a node for the same pending pods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubegpu.autoscaler.disruption import Disruption
from kubegpu.autoscaler.lifecycle import Lifecycle
from kubegpu.autoscaler.provisioner import Provisioner, take_snapshot
from kubegpu.autoscaler.state import name_of
from kubegpu.autoscaler.termination import Termination
from kubegpu.metrics import AutoscalerMetrics

if TYPE_CHECKING:
    from kubegpu.autoscaler.provider import CloudProvider
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.kube.leader import LeaderElector

LEASE_NAME = "kubegpu-autoscaler"


@dataclass(frozen=True)
class Options:
    batch_idle: float = 1.0
    batch_max: float = 10.0
    validation_delay: float = 15.0
    replacement_timeout: float = 600.0
    disruption: bool = True
    evict_pods: bool = True   # drain through the cluster (False: the provider's delete evicts, as the simulator's)


class Autoscaler:
    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock, options: Options | None = None,
                 log: Callable[[str], None] | None = None, elector: LeaderElector | None = None) -> None:
        opts = options or Options()
        self.elector = elector  # None: act on every pass (one replica, tests, the simulator)
        self.cluster = cluster
        self.provider = provider
        self.clock = clock
        self.options = opts
        self.log = log or (lambda _line: None)
        self.provisioner = Provisioner(cluster, provider, clock, opts.batch_idle, opts.batch_max, self.log)
        self.termination = Termination(cluster, provider, clock, self.log, opts.evict_pods)
        self.lifecycle = Lifecycle(cluster, provider, clock, self.termination.start, self.log)
        self.disruption = Disruption(cluster, provider, self.provisioner, self.termination, clock,
                                     opts.validation_delay, opts.replacement_timeout, self.log)
        self.metrics = AutoscalerMetrics()
        for component in (self.provisioner, self.termination, self.lifecycle, self.disruption):
            component.metrics = self.metrics

    def step(self) -> bool:
        """One pass; False, having done nothing, while another replica holds the Lease."""
        if self.elector is not None and not self.elector.try_acquire(self.clock.now()):
            self.provisioner.batcher.reset()  # a window from an earlier term must not fire on takeover
            return False
        tick = getattr(self.provider, "tick", None)
        if tick is not None:
            tick()
        snapshot = take_snapshot(self.cluster)
        self.lifecycle.reconcile(snapshot.nodeclaims, snapshot.nodes)
        # One fresh read serves the rest of the pass: termination removes the pods it evicts from it, new
        # NodeClaims are protected from disruption by their nominations until the next read sees them.
        snapshot = take_snapshot(self.cluster)
        self.termination.reconcile({name_of(c): c for c in snapshot.nodeclaims}, snapshot.pods, snapshot.pdbs)
        self.provisioner.reconcile(snapshot)
        if self.options.disruption:
            self.disruption.reconcile(snapshot)
        return True

    async def run(self, interval: float = 1.0, stop: asyncio.Event | None = None) -> None:
        """Step every `interval` seconds until `stop` is set; a failing pass is logged, the loop goes on."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                await loop.run_in_executor(None, self.step)
            except Exception as exc:  # one bad pass must not stop the controller
                self.log(f"autoscaler pass failed: {type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
