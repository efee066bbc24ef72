"""The MIG manager node agent: follow the Node's `nvidia.com/mig.config` label and apply that named layout.

The protocol is the GPU Operator's (reference/mig-geometry-and-partitioning.md §2.4, karpenter-dcgm-operator.md §C.3):
`nvidia.com/mig.config.state` goes `pending` → `success` | `failed` (| `rebooting`), and GPU clients are paused by
setting `nvidia.com/gpu.deploy.<component>=paused-for-mig-change` while the layout changes. Where NVIDIA's script can
leave those labels paused after an error — the wedge users report most — restoring them here sits in a `finally`,
and labels a crashed earlier run left paused are taken over and restored too. A failure or a partial apply always
ends in `failed` plus a Warning Event on the Node, so a node is never half-applied without saying so.

`MigManager.reconcile()` is synchronous and driven only by the Cluster, the GpuBackend and a clock, so tests run it
on `MemoryCluster` + `SimulatedBackend` step by step; `run()` is the thin watch loop around it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.errors import KubegpuError
from kubegpu.sharing.migapply import (
    ApplyError,
    ApplyOutcome,
    InUseError,
    assert_mismatches,
    execute,
    plan_apply,
    read_state,
)
from kubegpu.sharing.names import MIG_CONFIG_LABEL

if TYPE_CHECKING:
    from kubegpu.clock import Clock
    from kubegpu.config.migparted import MigPartedConfig
    from kubegpu.gpu.backend import GpuBackend
    from kubegpu.kube import Cluster

MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"
STATE_PENDING, STATE_SUCCESS, STATE_FAILED, STATE_REBOOTING = "pending", "success", "failed", "rebooting"
# Operands that hold the GPU open, with the `app` label of their pods (GPU Operator names).
GPU_CLIENTS: dict[str, str | None] = {
    "device-plugin": "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "dcgm-exporter": "nvidia-dcgm-exporter",
    "dcgm": "nvidia-dcgm",
    "nvsm": None,
}
EVENT_COMPONENT = "kubegpu-mig-manager"


@dataclass
class ReconcileResult:
    """What one reconcile did, for logs and tests."""

    applied: list[str] = field(default_factory=list)  # config names handled, in order
    state: str | None = None
    message: str = ""


class MigManager:
    """Applies the config named by the Node's `nvidia.com/mig.config` label; the newest label value always wins."""

    def __init__(
        self,
        cluster: Cluster,
        backend: GpuBackend,
        node_name: str,
        load_config: Callable[[], MigPartedConfig],
        clock: Clock,
        *,
        with_reboot: bool = False,
        reboot: Callable[[], None] | None = None,
        gpu_clients_namespace: str | None = None,
        clients: Sequence[str] = tuple(GPU_CLIENTS),
        pod_wait_timeout: float = 300.0,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.cluster = cluster
        self.backend = backend
        self.node_name = node_name
        self.load_config = load_config
        self.clock = clock
        self.with_reboot = with_reboot
        self.reboot = reboot
        self.gpu_clients_namespace = gpu_clients_namespace
        self.clients = tuple(clients)
        self.pod_wait_timeout = pod_wait_timeout
        self.sleep = sleep or (lambda seconds: None)
        self.last_handled: str | None = None

    # ----------------------------------------------------------------------------------------- the loop body

    def reconcile(self) -> ReconcileResult:
        """Apply the selected config, then again while the label keeps changing under us (newest wins)."""
        result = ReconcileResult()
        while True:
            node = self._node()
            selected = _labels(node).get(MIG_CONFIG_LABEL)
            if not selected or selected == self.last_handled:
                return result
            self.last_handled = selected
            result.applied.append(selected)
            try:
                result.state, result.message = self._handle(node, selected)
            except BaseException:
                self.last_handled = None  # the API failed under us: try this config again next time
                raise

    def needs_reconcile(self, node: dict[str, Any]) -> bool:
        """A watch event is worth a reconcile only when it changes the selected config."""
        selected = _labels(node).get(MIG_CONFIG_LABEL)
        return bool(selected) and selected != self.last_handled

    def run(
        self,
        stop: threading.Event,
        watch_timeout: float = 60.0,
        retry_after: float = 5.0,
        on_error: Callable[[KubegpuError], None] | None = None,
    ) -> None:
        """Reconcile now, then on every change of this Node's label until `stop` is set.

        An API failure (server restart, expired watch) is reported to `on_error` and retried after `retry_after`
        seconds with a fresh reconcile, so a change made while the watch was down is not missed.
        """
        while not stop.is_set():
            try:
                self.reconcile()
                self._follow(stop, watch_timeout)
            except KubegpuError as exc:
                if on_error is None:
                    raise
                on_error(exc)
                stop.wait(retry_after)

    def _follow(self, stop: threading.Event, watch_timeout: float) -> None:
        while not stop.is_set():
            for event in self.cluster.watch(
                "Node", field_selector=f"metadata.name={self.node_name}", timeout=watch_timeout
            ):
                if stop.is_set():
                    return
                if event.object.get("metadata", {}).get("name") == self.node_name and self.needs_reconcile(
                    event.object
                ):
                    self.reconcile()

    # ----------------------------------------------------------------------------------------- one config

    def _handle(self, node: dict[str, Any], selected: str) -> tuple[str, str]:
        self._set_state(STATE_PENDING)  # every request is answered pending → success | failed, as the operator's
        try:
            config = self.load_config()
            state = read_state(self.backend)
            if not assert_mismatches(config, selected, state):
                return self._finish(STATE_SUCCESS, f"MIG config {selected!r} is already applied", selected)
            plan_apply(config, selected, state)  # validate everything before pausing anyone
        except InUseError as exc:
            return self._fail(selected, f"MIG config {selected!r} not applied: {exc}", "MigDeviceInUse")
        except KubegpuError as exc:
            return self._fail(selected, f"MIG config {selected!r} not applied: {exc}", "MigConfigInvalid")
        paused: list[str] = []
        outcome: ApplyOutcome | None = None
        error: str | None = None
        try:
            paused = self._pause_clients()
            self._wait_for_clients_to_stop(paused)
            plan = plan_apply(config, selected, read_state(self.backend))  # processes may have changed meanwhile
            outcome = execute(plan, self.backend)
        except ApplyError as exc:
            error = f"MIG config {selected!r} partially applied: {exc}" if exc.changed_gpus else str(exc)
        except KubegpuError as exc:
            error = f"MIG config {selected!r} not applied: {exc}"
        except Exception as exc:  # whatever broke, the node must not stay `pending` with its clients paused
            error = f"MIG config {selected!r} not applied: {type(exc).__name__}: {exc}"
        finally:
            restore_error = self._restore_clients(paused)
        if error is not None or outcome is None:
            message = "; ".join(m for m in (error or "apply did not finish", restore_error) if m)
            return self._fail(selected, message, "MigConfigFailed")
        if restore_error:
            return self._fail(selected, restore_error, "MigClientsNotRestored")
        if outcome.pending_reset:
            return self._needs_reset(selected, outcome)
        self._event(f"MIG config {selected!r} applied (GPUs changed: {outcome.changed})", "MigConfigApplied", "Normal")
        return self._finish(STATE_SUCCESS, f"MIG config {selected!r} applied", selected)

    def _needs_reset(self, selected: str, outcome: ApplyOutcome) -> tuple[str, str]:
        message = f"MIG config {selected!r}: MIG mode change on GPUs {outcome.pending_reset} needs a GPU reset"
        if self.with_reboot and self.reboot is not None:
            self._event(message + "; rebooting the node", "MigConfigRebooting", "Warning")
            self._set_state(STATE_REBOOTING)
            self.reboot()
            return STATE_REBOOTING, message
        return self._fail(selected, message + " (reboot not allowed: start with --with-reboot)", "MigModeChangePending")

    def _finish(self, state: str, message: str, selected: str | None = None) -> tuple[str, str]:
        """Write a final state, unless the label moved on meanwhile: then the newer config's `pending` follows,
        and a stale `success` must not be read as the answer to the newer request."""
        if selected is not None and _labels(self._node()).get(MIG_CONFIG_LABEL) != selected:
            return state, message + " (superseded by a newer nvidia.com/mig.config)"
        self._set_state(state)
        return state, message

    def _fail(self, selected: str, message: str, reason: str) -> tuple[str, str]:
        self._event(message, reason, "Warning")
        return self._finish(STATE_FAILED, message, selected)

    # ----------------------------------------------------------------------------------------- GPU clients

    def _pause_clients(self) -> list[str]:
        """Set `gpu.deploy.<c>` from "true" to paused; labels already paused (a crashed run) are ours to restore."""
        labels = _labels(self._node())
        paused = [c for c in self.clients if labels.get(DEPLOY_LABEL_PREFIX + c) in ("true", PAUSED)]
        changes = {DEPLOY_LABEL_PREFIX + c: PAUSED for c in paused if labels.get(DEPLOY_LABEL_PREFIX + c) == "true"}
        if changes:
            self._patch_labels(changes)
        return paused

    def _restore_clients(self, paused: Sequence[str], attempts: int = 3) -> str | None:
        """Put every label we paused back to "true"; returns an error line if the API refused every attempt."""
        if not paused:
            return None
        last = ""
        for _ in range(attempts):
            try:
                labels = _labels(self._node())
                changes = {DEPLOY_LABEL_PREFIX + c: "true" for c in paused
                           if labels.get(DEPLOY_LABEL_PREFIX + c) == PAUSED}
                if changes:
                    self._patch_labels(changes)
                return None
            except Exception as exc:  # the API server may be briefly unavailable; never leave clients paused silently
                last = f"{type(exc).__name__}: {exc}"
        return f"could not restore GPU client labels {list(paused)}: {last}"

    def _wait_for_clients_to_stop(self, paused: Sequence[str]) -> None:
        """Wait (up to `pod_wait_timeout` each) until the paused operands' pods are gone from this node."""
        if not self.gpu_clients_namespace:
            return
        for component in paused:
            app = GPU_CLIENTS.get(component)
            if app is None:
                continue
            deadline = self.clock.now() + self.pod_wait_timeout
            while self._client_pods(app):
                if self.clock.now() >= deadline:
                    raise KubegpuError(f"pods app={app} on node {self.node_name} did not stop within "
                                       f"{self.pod_wait_timeout:.0f}s")
                self.sleep(1.0)

    def _client_pods(self, app: str) -> list[dict[str, Any]]:
        pods = self.cluster.list(
            "Pod", namespace=self.gpu_clients_namespace, label_selector=f"app={app}",
            field_selector=f"spec.nodeName={self.node_name}",
        )
        return [p for p in pods if p.get("spec", {}).get("nodeName") == self.node_name]

    # ----------------------------------------------------------------------------------------- API helpers

    def _node(self) -> dict[str, Any]:
        return self.cluster.get("Node", self.node_name)

    def _patch_labels(self, labels: Mapping[str, str | None]) -> None:
        self.cluster.patch("Node", self.node_name, {"metadata": {"labels": dict(labels)}})

    def _set_state(self, state: str) -> None:
        self._patch_labels({MIG_STATE_LABEL: state})

    def _event(self, message: str, reason: str, type_: str) -> None:
        from kubegpu.kube import record_event

        try:
            record_event(self.cluster, self._node(), reason, message, type_=type_, component=EVENT_COMPONENT)
        except Exception:  # an Event is best effort; the state label carries the outcome
            return


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})
