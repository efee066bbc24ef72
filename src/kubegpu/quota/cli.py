"""`kubegpu quota explain | manifests | controller`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from kubegpu.cliopts import FORMATS, duration_option, emit, legacy_alias, metrics_address_option, output_option
from kubegpu.errors import ConfigError
from kubegpu.sharing.charges import DEFAULT_REPLICAS, ChargeTable, PodCharge, pod_charge, quantity_of_bytes

quota_app = typer.Typer(help="GPU quotas in kubegpu.io/gpu-memory: explain a pod's charge, ship the policy.",
                        no_args_is_help=True)


def _pod_of(document: object, source: str) -> Mapping[str, Any]:
    """The pod a file describes: a Pod, or the pod template of a workload (Deployment, Job, ...), named after it."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{source}: expected a Pod (a mapping), got {type(document).__name__}")
    kind = document.get("kind") or "Pod"
    if kind == "Pod":
        return document
    spec = document.get("spec") or {}
    template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template")
    if not isinstance(template, Mapping):
        raise ConfigError(f"{source}: kind {kind} has no pod template (spec.template); expected a Pod")
    meta = dict(document.get("metadata") or {})
    template_meta = {**(template.get("metadata") or {}), "name": meta.get("name", ""),
                     "namespace": meta.get("namespace") or (template.get("metadata") or {}).get("namespace")}
    return {**template, "metadata": template_meta}


def _table(config: Path | None, models: list[str] | None, nodepools: Path | None) -> ChargeTable:
    """The cluster's models and the GPUs its NodePools may launch (with neither: the whole catalog), and the replicas
    of a device-plugin config (default: the shipped table's)."""
    replicas = dict(DEFAULT_REPLICAS)
    if config is not None:
        from kubegpu.config.deviceplugin_models import load_device_plugin_config
        from kubegpu.sharing.charges import replicas_of_config

        replicas = replicas_of_config(load_device_plugin_config(config))
    return ChargeTable.for_cluster([m for value in models or () for m in value.split(",") if m], (), replicas,
                                   _nodepools(nodepools) if nodepools is not None else ())


def _nodepools(path: Path) -> list[Mapping[str, Any]]:
    """NodePool manifests (kubegpu.io/v1 or karpenter.sh/v1): YAML or JSON, multi-document or a List."""
    from kubegpu.files import parse_yaml_documents, read_text

    pools: list[Mapping[str, Any]] = []
    for index, document in enumerate(parse_yaml_documents(read_text(path), str(path))):
        items = document.get("items") if isinstance(document, Mapping) and document.get("kind") == "List" else None
        for item in items if isinstance(items, list) else [document]:
            if not isinstance(item, Mapping) or item.get("kind") != "NodePool":
                raise ConfigError(f"{path}: document {index}: expected a NodePool, got "
                                  f"{item.get('kind') if isinstance(item, Mapping) else type(item).__name__}")
            pools.append(item)
    return pools


def _models_option(help_text: str) -> list[str] | None:
    return typer.Option(None, "--models", metavar="MODEL[,MODEL...]", help=help_text)


def _nodepools_option() -> Path | None:
    return typer.Option(None, "--nodepools", metavar="FILE", help="NodePool manifests (kubegpu.io/v1 or "
                        "karpenter.sh/v1): the GPUs they may launch join the cluster's.")


def _print_table(charge: PodCharge, claims: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kubegpu.io/gpu-memory charged to pod {charge.pod}")
    for column in ("container", "resource", "count", "each", "total"):
        table.add_column(column, justify="right" if column in ("count", "each", "total") else "left")
    for line in charge.lines:
        table.add_row(line.container, line.resource, str(line.count), quantity_of_bytes(line.bytes_each),
                      quantity_of_bytes(line.total))
    for claim in claims:   # a named claim is charged once, whichever of its pods comes first
        table.add_row(f"claim {claim.entry}", f"{claim.kind}/{claim.source}", "1", quantity_of_bytes(claim.bytes),
                      quantity_of_bytes(claim.bytes) or "0")
    total = charge.gpu_memory_bytes + sum(claim.bytes for claim in claims)
    console = Console()
    console.print(table)
    console.print(f"total: {quantity_of_bytes(total)} ({total} bytes)")


_CLAIM_KINDS = ("ResourceClaimTemplate", "ResourceClaim", "DeviceClass")


def _documents(files: list[Path]) -> tuple[Mapping[str, Any], dict[str, list[Mapping[str, Any]]]]:
    """The pod (the first document that is not a DRA object) and the ResourceClaimTemplates, ResourceClaims and
    DeviceClasses given with it (in the same file or more `-f` files)."""
    from kubegpu.files import parse_yaml_documents, read_text

    pod: Mapping[str, Any] | None = None
    found: dict[str, list[Mapping[str, Any]]] = {kind: [] for kind in _CLAIM_KINDS}
    for path in files:
        for index, document in enumerate(parse_yaml_documents(read_text(path), str(path))):
            kind = document.get("kind") if isinstance(document, Mapping) else None
            if kind in found and isinstance(document, Mapping):
                found[str(kind)].append(document)
            elif pod is None:
                pod = _pod_of(document, f"{path}: document {index}")
            else:
                raise ConfigError(f"{path}: document {index}: a second pod ({kind or 'no kind'}); give one pod and "
                                  f"its {', '.join(_CLAIM_KINDS)}")
    if pod is None:
        raise ConfigError(f"{', '.join(map(str, files))}: no pod (or workload with a pod template) given")
    return pod, found


def _claim_charges(pod: Mapping[str, Any], found: dict[str, list[Mapping[str, Any]]],
                   table: ChargeTable) -> list[Any]:
    """The pod's ResourceClaims charged as the quota controller charges them (the shipped DeviceClasses, and any
    given, by name)."""
    from kubegpu.dra.classes import shipped_class_objects
    from kubegpu.quota.claims import ClaimSourceMissing, parse_classes, pod_claim_charges

    if not (pod.get("spec") or {}).get("resourceClaims"):
        return []
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")

    def by_name(kind: str) -> dict[str, Mapping[str, Any]]:
        return {str((o.get("metadata") or {}).get("name")): o for o in found[kind]
                if ((o.get("metadata") or {}).get("namespace") or namespace) == namespace}

    classes = {**parse_classes(shipped_class_objects()), **parse_classes(found["DeviceClass"])}
    try:
        return pod_claim_charges(pod, by_name("ResourceClaimTemplate"), by_name("ResourceClaim"), classes, table)
    except ClaimSourceMissing as exc:
        raise ConfigError(f"{exc} (give it with -f)") from None


@quota_app.command("explain")
def explain_command(
    files: list[Path] = typer.Option(..., "--file", "-f", help="The pod (YAML or JSON; or a workload with a pod "
                                     "template), with the ResourceClaimTemplates / ResourceClaims it names (same "
                                     "file or more -f)."),
    config: Path | None = typer.Option(None, "--config", help="NVIDIA device-plugin config (version: v1): the "
                                       "replicas of time-slicing / MPS resources, as the nodes have them."),
    output: str = output_option("table", FORMATS),
    models: list[str] | None = _models_option("The cluster's GPU models (catalog keys or GFD products; default: "
                                              "the whole catalog): a whole GPU is charged the largest the pod "
                                              "may land on."),
    nodepools: Path | None = _nodepools_option(),
) -> None:
    """The kubegpu.io/gpu-memory a pod is charged, line by line, its ResourceClaims included."""
    table = _table(config, models, nodepools)
    pod, found = _documents(files)
    charge = pod_charge(pod, table)
    claims = _claim_charges(pod, found, table)
    data = charge.as_json()
    if claims:
        data["gpuMemoryBytes"] += sum(c.bytes for c in claims)
        data["claims"] = [c.as_json() for c in claims]
    emit(data, output, table=lambda: _print_table(charge, claims))


@quota_app.command("manifests")
def manifests_command(
    output_dir: Path = typer.Option(..., "--output-dir", metavar="DIR", help="Directory for the plain manifests."),
    config: Path | None = typer.Option(None, "--config", help="NVIDIA device-plugin config the table's replicas "
                                       "come from (default: nvidia.com/gpu.shared with 4 replicas)."),
    models: list[str] | None = _models_option("The cluster's GPU models the table lists (default: the whole "
                                              "catalog)."),
    nodepools: Path | None = _nodepools_option(),
) -> None:
    """Write deploy/kubernetes/quota/ (applied in file-name order): the CRD, the charge table, the policies."""
    from kubegpu.quota.manifests import write_manifests

    for path in write_manifests(output_dir, _table(config, models, nodepools)):
        typer.echo(str(path))


@quota_app.command("controller")
def controller_command(
    leader_elect: bool = typer.Option(True, "--leader-elect/--no-leader-elect",
                                      help="Act only while holding the kubegpu-quota Lease."),
    namespace: str = typer.Option("kubegpu", "--namespace", help="Namespace of the leader Lease."),
    interval: float = duration_option(2.0, "--interval", positive=True, help="Time between passes."),
    lease_duration: float = duration_option(15.0, "--lease-duration", positive=True,
                                            help="How long a leader holds the Lease."),
    metrics_address: str = metrics_address_option("", "HOST:PORT to serve /metrics (kubegpu_informer_synced) and "
                                                  "/readyz on (empty: off)."),
) -> None:
    """Run the quota controller: charge ResourceClaims and lift kubegpu.io/gpu-memory gates, lift kubegpu.io/quota
    gates, reclaim borrowed pods, report used."""
    import logging
    import os
    import socket

    from kubegpu.kube.informer import InformedCluster
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.quota.controller import INFORMED_KINDS, QuotaController, run
    from kubegpu.shutdown import stop_on_signals

    if interval <= 0 or lease_duration <= 0:
        raise ConfigError("--interval and --lease-duration must be positive")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    # listed once, then watched; the controller never modifies what it reads, so the cache hands out its objects
    informed = InformedCluster(LightkubeCluster(), INFORMED_KINDS, copy=False)
    controller = QuotaController(informed, identity=identity, leader_elect=leader_elect,
                                 lease_namespace=namespace, lease_duration=lease_duration)
    if metrics_address:
        from prometheus_client import REGISTRY

        from kubegpu.metrics import serve_metrics

        informed.register_metrics(REGISTRY, "quota")   # kubegpu_informer_synced; /readyz 503 while stale
        serve_metrics(metrics_address, ready=informed.trusted)
    stop = stop_on_signals()
    run(controller, interval, stop.is_set)


def register(app: typer.Typer) -> None:
    app.add_typer(quota_app, name="quota")
    legacy_alias("quota manifests", "-o", "--output-dir")
