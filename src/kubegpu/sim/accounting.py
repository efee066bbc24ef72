"""Accounting for pods: the pending queue and kube-scheduler's binding pass, the devices each pod gets, its speed
under sharing (`kubegpu.sim.perf`) and the work it has left, OOM kills, completions, evictions and retries — every
number the metrics collector records.

Why it is fast enough for a day of 800 GPUs and 50,000 pods: NodeInfos are updated in place (never rebuilt per
pod), pods are parsed once, pending pods are queued per request shape, and a shape that did not fit is not tried
again until capacity of its resource is freed (what kube-scheduler's queueing hints do).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from typing import Any

from kubegpu.gpu.catalog import GpuModel
from kubegpu.scheduling import QUOTA_GATE, NodeInfo, PodRequirements, fits, pod_requirements, select_node
from kubegpu.sharing.devices import (
    AnnotatedDevice,
)
from kubegpu.sim.guard import GUARD_LEAD_S, RESERVE_GIB, next_share_crossing, over_share, refresh_shares
from kubegpu.sim.perf import allocating_pod, first_overflow, mig_speed, mps_speeds, time_slicing_speeds
from kubegpu.sim.strategies import GpuRequest
from kubegpu.sim.teams import capacity_bytes
from kubegpu.sim.workload import Job
from kubegpu.sim.world import (
    _ARRIVAL,
    _FINISH,
    _GUARD,
    _OOM,
    CLASS_LABEL,
    RETRY_BACKOFF_MAX_S,
    RETRY_BACKOFF_S,
    Attempt,
    Partition,
    SimCore,
    SimNode,
    _partition_key,
    _unique,
    write_create,
    write_patch,
)

_NO_FIT = -1.0  # below every score (0..100) and the starting best: never chosen


class Accounting(SimCore):
    """The pod side of `Simulation` (and `SimControl.pending_pods`)."""

    _scores: dict[tuple[int, str, int], float]  # (node state id, resource, count) → score, or _NO_FIT
    _state_ids: dict[tuple[Any, ...], int]  # SimNode.state_key → its number
    _scorer: Callable[[PodRequirements, NodeInfo], float]

    def _freed(self, resource: str) -> None:
        self._capacity_version[resource] = self._capacity_version.get(resource, 0) + 1
        self._dirty = True

    def _enqueue(self, job: Job, attempt: int, ooms: int, now: float) -> None:
        request = self.strategy.request_for(job, self.models)
        name = job.name if attempt == 0 else f"{job.name}-r{attempt}"
        pod = _pod_object(name, job, request)
        requests = {request.resource: float(request.count), "pods": 1.0}
        run = Attempt(job, attempt, ooms, name, request, now, next(self._seq), pod, requests,
                      pod_requirements(pod, requests))
        if self._teams is not None:
            # behind its team's quota until the admission step lets it through: gated, as the quota's admission
            # policy creates it (a plain ResourceQuota refuses it instead), so no controller acts for it meanwhile
            pod["spec"]["schedulingGates"] = [{"name": QUOTA_GATE}]
            self._teams.hold(run)
        else:
            heapq.heappush(self._queues.setdefault(request, []), (run.sort_key(), run))
        self.metrics.queued(run)
        write_create(self.cluster, pod)
        self._dirty = True

    def _pending_count(self) -> int:
        held = len(self._teams.held) if self._teams is not None else 0
        return held + sum(len(queue) for queue in self._queues.values())

    def _admit(self) -> None:
        """Teams: let held pods through their quota (and evict what an elastic quota reclaims) before binding."""
        assert self._teams is not None
        released, victims = self._teams.step(self._capacity_bytes)
        for run in released:
            heapq.heappush(self._queues.setdefault(run.request, []), (run.sort_key(), run))
            meta = run.pod["metadata"]
            write_patch(self.cluster, "Pod", meta["name"], {"spec": {"schedulingGates": None}},
                        namespace=meta["namespace"])
        for run in victims:
            self._stop(run, "evicted")  # comes back as a new pod, held again

    def _capacity_bytes(self) -> float:
        """The cluster's GPU memory, worked out again only when a node became ready or left."""
        if self._capacity_memo[0] != self._fleet_version:
            self._capacity_memo = (self._fleet_version, capacity_bytes(list(self._nodes.values())))
        return self._capacity_memo[1]

    def _schedule(self) -> None:
        """One scheduling pass: bind pending pods in priority/FIFO order until every request shape stops fitting."""
        self._dirty = False
        if self._teams is not None:
            self._admit()
        heads = []
        for request, queue in self._queues.items():
            version = self._capacity_version.get(request.resource, 0)
            if queue and self._failed_at.get(request) != version:
                heads.append((queue[0][0], request))
        heapq.heapify(heads)
        while heads:
            _, request = heapq.heappop(heads)
            queue = self._queues[request]
            run = queue[0][1]
            node = self._choose_node(run)
            if node is None:
                self._failed_at[request] = self._capacity_version.get(request.resource, 0)
                continue
            heapq.heappop(queue)
            self._bind(run, node)
            if queue:
                heapq.heappush(heads, (queue[0][0], request))

    def _choose_node(self, run: Attempt) -> SimNode | None:
        """kube-scheduler's choice, asked of one node per class of identical nodes: fit and score are the same
        for all of them and ties go to the first, so the answer is the one the full list would give. Classes are
        told apart by a number per distinct `SimNode.state_key` (`_state_id`), cheaper to compare than the key."""
        resource, count = run.request.resource, run.request.count
        representatives: dict[int, NodeInfo] = {}
        for node in self._nodes.values():
            if node.ready and len(node.free.get(resource, ())) >= count:
                state = node.state_id
                if state < 0:
                    state = self._state_id(node)
                if state not in representatives:
                    representatives[state] = node.info
        if not representatives:
            return None
        need = run.need
        if need.node_name is not None or need.node_selector or need.affinity_terms is not None or need.tolerations:
            chosen = select_node(need, representatives.values(), self.scoring)
        else:
            chosen = self._best(resource, count, need, representatives)
        return None if chosen is None else self._nodes[chosen.name]

    def _state_id(self, node: SimNode) -> int:
        """The number of the node's state key (the same for every node, and every time, the key is equal)."""
        ids = self._state_ids
        if len(ids) > 500_000:  # numbers start over: forget every node's and every score kept under them
            ids.clear()
            self._scores.clear()
            for other in self._nodes.values():
                other.state_id = -1
        node.state_id = ids.setdefault(node.state_key(), len(ids))
        return node.state_id

    def _best(self, resource: str, count: int, need: PodRequirements,
              representatives: dict[int, NodeInfo]) -> NodeInfo | None:
        """`select_node` for a pod that names no node, selector, affinity or toleration: whether it fits and its
        score then depend only on the node's state key (its group's labels and taints, allocatable and requested)
        and the pod's requests, so each is computed once per (state, request) and remembered: a scheduling pass
        binds pod after pod of one shape and changes one node each time."""
        scores = self._scores
        if len(scores) > 200_000:
            scores.clear()
        scorer = self._scorer
        best: NodeInfo | None = None
        best_score = _NO_FIT
        for state, info in representatives.items():
            memo = (state, resource, count)
            score = scores.get(memo)
            if score is None:
                score = scores[memo] = scorer(need, info) if fits(need, info).ok else _NO_FIT
            if score > best_score:
                best, best_score = info, score
        return best

    def _bind(self, run: Attempt, node: SimNode) -> None:
        now = self.clock.now()
        run.node = node
        run.devices = _pick_devices(node, run.request)
        node.info.add_pod(run.pod, run.requests)
        node.running.append(run)
        node.touch()
        run.parts = _unique([node.partitions[_partition_key(d)] for d in run.devices])
        run.remaining = run.job.work
        run.updated = now
        run.speed = 0.0
        first = run.devices[0]
        run.thread_fraction = (first.mps_thread_percentage or 100) / 100.0
        run.alloc_weight = sum(_alloc_weight(node.model, d) for d in run.devices)
        run.memory_in_use = sum(min(run.job.memory_gib, part.memory_gib) for part in run.parts)
        run.alloc_at = now + self.params.oom_delay_s
        for part in run.parts:
            part.residents.append(run)
        node.hold(run)
        if getattr(self.strategy, "memory_shared", False):
            refresh_shares(self.strategy, run)
        self.metrics.started(run, now)
        if self._teams is not None:
            self._teams.bound(run)
        name, namespace = run.pod["metadata"]["name"], run.pod["metadata"]["namespace"]
        write_patch(self.cluster, "Pod", name, {"spec": {"nodeName": node.name}}, namespace=namespace)
        write_patch(self.cluster, "Pod", name, {"status": {"phase": "Running"}}, namespace=namespace,
                    subresource="status")
        if node.rejects_multiple_shared and run.request.count > 1 and run.devices[0].shared:
            self._stop(run, "rejected")  # the device plugin's Allocate fails: the kubelet fails the pod
            return
        self._watch_memory(run.parts)
        self._reprice(run.parts)

    def _watch_memory(self, parts: Sequence[Partition]) -> None:
        """After the residents of these devices changed: when each next fills — the allocation that finds it full is
        OOM-killed (`_device_full`) — and, under `+guard`, when its free memory reaches the guard's reserve
        (`_guard_check`). Events of the devices' earlier residents go stale (`Partition.stamp`)."""
        now = self.clock.now()
        guard = getattr(self.strategy, "guard", None) is not None
        for part in parts:
            part.stamp += 1
            runs = part.residents
            if not runs:
                continue
            uses = [run.memory_use() for run in runs]
            limits = [_mps_limit(run, part) for run in runs]
            if any(limit is not None for limit in limits):  # MPS clients: each fails against its own limit
                found = [(over.at, index) for index, (use, limit) in enumerate(zip(uses, limits, strict=True))
                         if limit is not None and (over := first_overflow([use], limit, now)) is not None]
                if found:
                    at, index = min(found)
                    self._push(at, _OOM, (part, part.stamp, index))
                continue
            over = first_overflow(uses, part.memory_gib, now)
            if over is not None:
                self._push(over.at, _OOM, (part, part.stamp, over.victim))
            if guard and not part.mig:
                near = first_overflow(uses, part.memory_gib - RESERVE_GIB, now)
                if near is not None:
                    at = near.at - GUARD_LEAD_S if near.victim is not None else near.at
                    self._push(max(now, at), _GUARD, (part, part.stamp))

    def _device_full(self, part: Partition, stamp: int, victim: int | None) -> None:
        """An allocation finds the device full: the driver fails it and its pod is OOM-killed. A pod's first
        allocation that does not fit is known; when creeping use filled the device, the next allocation is whoever
        makes it (weighted by how busy each pod keeps the GPU; seeded, so a run repeats)."""
        if part.stamp != stamp or not part.residents:
            return
        runs = part.residents
        if victim is None:
            now = self.clock.now()
            draw = random.Random(f"{self.scenario.seed}:{part.key}:{now:.6f}").random()
            victim = allocating_pod([run.job.compute for run in runs], draw)
        self._stop(runs[victim], "oom")

    def _guard_check(self, part: Partition, stamp: int) -> None:
        """The guard finds the device's free memory at its reserve: the pods over their share are evicted; if none
        is yet, it looks again when the next creeping pod passes its share."""
        if part.stamp != stamp or not part.residents:
            return
        now = self.clock.now()
        first = part.residents[0]
        device = next((d for d in first.devices if _partition_key(d) == part.key), first.devices[0])
        offenders = over_share(part, device, now + GUARD_LEAD_S)
        for offender in offenders:
            if offender.node is not None:
                self._stop(offender, "guard")
        if not offenders:
            again = next_share_crossing(part, now)
            if again is not None:
                self._push(again, _GUARD, (part, part.stamp))

    def _reprice(self, parts: Sequence[Partition]) -> None:
        """Recompute the speed of every pod on these partitions and move their completion events."""
        now = self.clock.now()
        speeds: dict[int, float] = {}
        affected: dict[int, Attempt] = {}
        part_speeds = {id(part): self._partition_speeds(part) for part in parts}
        for part in parts:
            for run in part.residents:
                affected[id(run)] = run
        for key, run in affected.items():
            speed = 1.0
            for part in run.parts:
                own = part_speeds.get(id(part))
                if own is None:
                    own = part_speeds[id(part)] = self._partition_speeds(part)
                speed = min(speed, own[id(run)])
            speeds[key] = speed
        for key, run in affected.items():
            speed = speeds[key]
            if speed == run.speed:
                continue
            run.remaining -= run.speed * run.job.gpus * (now - run.updated)
            run.updated = now
            self.metrics.speed_changed(run, run.speed, speed)
            run.speed = speed
            run.version += 1
            rate = speed * run.job.gpus
            if rate > 0:  # a pod at speed 0 (never with the built-in model) waits for its next repricing
                self._push(now + max(0.0, run.remaining) / rate, _FINISH, (run, run.version))

    def _partition_speeds(self, part: Partition) -> dict[int, float]:
        runs = part.residents
        needs = [run.job.compute for run in runs]
        if part.sharing == "mps":
            speeds = mps_speeds(needs, [run.thread_fraction for run in runs], self.params)
        else:
            speeds = time_slicing_speeds(needs, self.params)
        if part.mig:
            speeds = [s * mig_speed(run.job.compute, part.sms, part.full_sms, self.params)
                      for s, run in zip(speeds, runs, strict=True)]
        return {id(run): speed for run, speed in zip(runs, speeds, strict=True)}

    def _stop(self, run: Attempt, outcome: str) -> None:
        """A pod ends (completed, oom, evicted): free its devices, reprice its neighbours, retry if it may."""
        now = self.clock.now()
        node = run.node
        assert node is not None
        run.remaining -= run.speed * run.job.gpus * (now - run.updated)
        self.metrics.stopped(run, now, outcome)
        if self._teams is not None:
            self._teams.stopped(run)
        node.info.remove_pod(run.pod, run.requests)
        node.running.remove(run)
        node.release(run)
        node.touch()
        for part in run.parts:
            part.residents.remove(run)
        for device in run.devices:
            if device.resource in node.free and node.partitions.get(_partition_key(device)) is not None:
                node.free[device.resource].append(device)
        node.free.get(run.request.resource, []).sort(key=lambda d: d.id)
        run.node = None
        run.version += 1
        self._freed(run.request.resource)
        self.cluster.delete("Pod", run.pod["metadata"]["name"], namespace=run.pod["metadata"]["namespace"])
        self._watch_memory(run.parts)
        self._reprice(run.parts)
        if outcome in ("oom", "guard") and run.ooms < run.job.max_retries:
            backoff = min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2**run.ooms)
            self._push(now + backoff, _ARRIVAL, (run.job, run.attempt + 1, run.ooms + 1))
        elif outcome == "evicted":
            self._push(now, _ARRIVAL, (run.job, run.attempt + 1, run.ooms))

    def _finish_metrics(self) -> None:
        now = self.clock.now()
        for queue in self._queues.values():
            for _, run in queue:
                self.metrics.still_pending(run, now)
        for run in self._teams.held.values() if self._teams is not None else ():
            self.metrics.still_pending(run, now)

    def pending_pods(self) -> list[dict[str, Any]]:
        runs = [run for queue in self._queues.values() for _, run in queue]
        runs.sort(key=Attempt.sort_key)
        return [run.pod for run in runs]


def _pod_object(name: str, job: Job, request: GpuRequest) -> dict[str, Any]:
    limits = {request.resource: str(request.count)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job.namespace, "uid": f"sim-{name}",
                     "labels": {CLASS_LABEL: job.klass}},
        "spec": {"priority": job.priority, "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def _alloc_weight(model: GpuModel, device: AnnotatedDevice) -> float:
    """How much of a GPU one device ID hands out: a whole GPU, a MIG slice's compute share, or one replica."""
    if device.mps_memory_mib and device.replica is None:
        return device.mps_memory_mib / model.memory_mib
    share = 1.0 / device.replicas if device.replica is not None else 1.0
    if device.mig is not None and model.mig_compute_slices:
        share *= model.profile(device.mig.profile_id).compute_slices / model.mig_compute_slices
    return share


def _pick_devices(node: SimNode, request: GpuRequest) -> list[AnnotatedDevice]:
    """The devices a pod gets: whole devices in ID order; replicas spread over the least-shared GPUs first (what
    NVIDIA's device plugin prefers for shared GPUs)."""
    free = node.free[request.resource]
    if free[0].replica is None:
        chosen = free[: request.count]
    else:
        load: dict[int, int] = {}
        for run in node.running:
            for device in run.devices:
                load[device.gpu_index] = load.get(device.gpu_index, 0) + 1
        ranked = sorted(free, key=lambda d: (load.get(d.gpu_index, 0), d.gpu_index, d.id))
        chosen, used_gpus = [], set()
        for device in ranked:
            if device.gpu_index not in used_gpus:
                chosen.append(device)
                used_gpus.add(device.gpu_index)
            if len(chosen) == request.count:
                break
        for device in ranked:
            if len(chosen) == request.count:
                break
            if device not in chosen:
                chosen.append(device)
    taken = {d.id for d in chosen}
    node.free[request.resource] = [d for d in free if d.id not in taken]
    return list(chosen)


def _mps_limit(run: Attempt, part: Partition) -> float | None:
    """The pinned-memory limit (GiB) `run`'s MPS device on `part` enforces; None where nothing limits it."""
    for device in run.devices:
        if _partition_key(device) == part.key and device.mps_memory_mib:
            return device.mps_memory_mib / 1024
    return None
