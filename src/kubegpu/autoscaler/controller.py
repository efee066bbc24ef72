"""The autoscaler: NodeClaim lifecycle, provisioning, disruption, termination and the provider's upkeep, as stages.

`Autoscaler.step()` is one synchronous pass through every stage, so the same code runs under `kubegpu autoscaler`
and in the simulator (virtual clock, one step per tick). Each stage stands alone: one that fails is logged and the
others still run. `run()` (the command) goes further and runs the stage groups concurrently — lifecycle with
provisioning and disruption, termination, and each upkeep task of the provider (the simulated provider's kubelet,
EC2NodeClass status, interruption messages, garbage collection) — so a slow cloud call in one never holds up the
others.

Every pass reads the cluster from memory: `ClusterState` wraps the cluster in informers (listed once, then
watched). With a `LeaderElector` (the command always has one) only the holder of the `kubegpu-autoscaler` Lease
acts, so several replicas can run: two acting at once would each buy a node for the same pending pods. Every write
(to the cluster and the provider's create and delete) goes through the elector's fence (`kube.leader`), so a stage
that is still running when the Lease is lost stops at its next write instead of acting as a second leader.
What a leader leaves half done is recorded in the API before it is done (`recovery.py`), and every pass — a new
leader's first among them — finishes or undoes it.

The cloud is a `CloudProvider` the controller is handed (`provider.py`: the simulated one; `aws/`: EC2); what a
provider must also do on a schedule it hands in as `upkeep` tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kubegpu.autoscaler.cluster_state import ClusterState, Snapshot, informed
from kubegpu.autoscaler.disruption import Disruption
from kubegpu.autoscaler.lifecycle import Lifecycle
from kubegpu.autoscaler.provisioner import Provisioner
from kubegpu.autoscaler.recovery import Recovery
from kubegpu.autoscaler.termination import Termination
from kubegpu.kube.informer import cache_trusted
from kubegpu.kube.leader import Fence, FencedCluster, fenced, guard
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
    parallelism: int = 1      # NodeClaim creations, launches and registrations at a time (the command: 16)
    surplus_grace: float = 3.0   # an unused NodeClaim bought for pods that landed elsewhere goes after this long
    node_cost: float = 0.0       # $/h each new node costs beyond its price (see run_pass); the commands pass NODE_COST


class Upkeep(Protocol):
    """A provider's periodic task (EC2NodeClass status, interruption queue, garbage collection): its own stage."""

    name: str
    kinds: tuple[str, ...]   # further kinds the autoscaler's informers must hold for it (e.g. EC2NodeClass)

    def run(self, scaler: Autoscaler) -> None: ...


class Autoscaler:
    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock, options: Options | None = None,
                 log: Callable[[str], None] | None = None, elector: LeaderElector | None = None,
                 upkeep: Sequence[Upkeep] = ()) -> None:
        opts = options or Options()
        self.elector = elector  # None: act on every pass (one replica, tests, the simulator)
        self.upkeep = list(upkeep)
        fence = Fence(elector, clock) if elector is not None else None
        self.fence = guard(fence)   # what a write that bypasses the cluster and the provider checks first
        store = FencedCluster(cluster, fence) if fence is not None else cluster
        self.cluster = informed(store, [k for task in self.upkeep for k in task.kinds])
        self.state = ClusterState(self.cluster, clock, 2 * opts.batch_max)
        attach = getattr(provider, "attach", None)
        if attach is not None and getattr(provider, "cluster", None) is cluster:
            attach(self.cluster)   # the kwok provider's Node reads come from the informers, not a GET each pass
        self.provider = fenced(provider, fence, ("create", "delete")) if fence is not None else provider
        provider = self.provider
        self.clock = clock
        self.options = opts
        self.log = log or (lambda _line: None)
        self.provisioner = Provisioner(self.cluster, provider, clock, opts.batch_idle, opts.batch_max, self.log,
                                       state=self.state, parallelism=opts.parallelism,
                                       surplus_grace=opts.surplus_grace, node_cost=opts.node_cost)
        self.termination = Termination(self.cluster, provider, clock, self.log, opts.evict_pods, state=self.state,
                                       parallelism=opts.parallelism)
        self.lifecycle = Lifecycle(self.cluster, provider, clock, self.termination.start, self.log,
                                   state=self.state, parallelism=opts.parallelism)
        self.provisioner.terminate = self.termination.start
        self.lifecycle.before_register = self.provisioner.reservations.prepare
        self.disruption = Disruption(self.cluster, provider, self.provisioner, self.termination, clock,
                                     opts.validation_delay, opts.replacement_timeout, self.log)
        self.recovery = Recovery(self.cluster, self.termination, self.log)
        self.metrics = AutoscalerMetrics()
        self.cluster.register_metrics(self.metrics.registry, "autoscaler")  # kubegpu_informer_synced
        for component in (self.provisioner, self.termination, self.lifecycle, self.disruption):
            component.metrics = self.metrics
        self.failures: dict[str, int] = {}   # stage → passes it failed in (for tests and logs)
        self._last: Snapshot | None = None

    # -- stages ---------------------------------------------------------------------------------------------------
    def _stage(self, name: str, work: Callable[[], object]) -> bool:
        """Run one stage; a failure is logged and counted, never raised: the other stages go on."""
        if not cache_trusted(self.cluster):  # watches broken too long: no action on a view that may be stale
            return False
        try:
            work()
            return True
        except Exception as exc:
            self.failures[name] = self.failures.get(name, 0) + 1
            self.log(f"autoscaler {name} failed: {type(exc).__name__}: {exc}")
            return False

    def _tick(self) -> None:
        tick = getattr(self.provider, "tick", None)
        if tick is not None:
            tick()

    def _core(self) -> None:
        """Lifecycle, then provisioning and disruption on a fresh read (lifecycle's writes are in it)."""
        snapshot = self.state.snapshot()
        self._stage("recovery", lambda: self.recovery.reconcile(snapshot))
        self._stage("lifecycle", lambda: self.lifecycle.reconcile(snapshot.nodeclaims, snapshot.nodes))
        snapshot = self.state.snapshot()
        self._stage("provisioning", lambda: self.provisioner.reconcile(snapshot))
        if self.options.disruption:
            self._stage("disruption", lambda: self.disruption.reconcile(snapshot))
        self._last = snapshot

    def _terminate(self, snapshot: Snapshot | None = None) -> None:
        self.termination.reconcile(snapshot or self.state.snapshot())

    def _leading(self) -> bool:
        if self.elector is None:
            return True
        if self.elector.try_acquire(self.clock.now()):
            return True
        self.provisioner.batcher.reset()  # a window from an earlier term must not fire on takeover
        return False

    def step(self) -> bool:
        """One pass through every stage; False, having done nothing, while another replica holds the Lease."""
        if not self._leading():
            return False
        self._stage("provider", self._tick)
        for task in self.upkeep:
            self._stage(task.name, lambda task=task: task.run(self))  # type: ignore[misc]
        self._last = None
        self._core()
        # the pass's read serves termination too, unless this pass asked for deletions it does not show yet
        last = None if self.state.deleting else self._last
        self._stage("termination", lambda: self._terminate(last))
        return True

    def close(self) -> None:
        """Stop the informers' watches (the command exits anyway; tests building many autoscalers call it)."""
        self.cluster.stop()

    # -- the command's loop ---------------------------------------------------------------------------------------
    async def run(self, interval: float = 1.0, stop: asyncio.Event | None = None) -> None:
        """Every `interval` seconds while leader, each stage group in its own worker, until `stop` is set."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        groups: list[tuple[str, Callable[[], object]]] = [
            ("provider", self._tick), ("core", self._core), ("termination", self._terminate),
            *((task.name, lambda task=task: task.run(self)) for task in self.upkeep)]  # type: ignore[misc]
        leading = asyncio.Event()
        # renewed well within the fence's deadline, so a short --lease-duration does not close it between renewals
        renew_every = min(interval, self.elector.renew_deadline / 2) if self.elector is not None else interval

        async def elect() -> None:
            while not stop.is_set():
                try:
                    is_leader = await loop.run_in_executor(None, self._leading)
                except Exception as exc:
                    self.log(f"autoscaler leader election failed: {type(exc).__name__}: {exc}")
                    is_leader = False
                (leading.set if is_leader else leading.clear)()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=renew_every)

        async def group(name: str, work: Callable[[], object], pool: ThreadPoolExecutor) -> None:
            while not stop.is_set():
                started = time.monotonic()
                if leading.is_set():
                    await loop.run_in_executor(pool, self._stage, name, work)
                wait = max(0.0, interval - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=wait or 0.01)

        with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="autoscaler") as pool:
            await asyncio.gather(elect(), *(group(name, work, pool) for name, work in groups))
