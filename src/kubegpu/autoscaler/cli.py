"""`kubegpu provision` (one offline pass) and `kubegpu autoscaler` (the controller against a cluster)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kubegpu.autoscaler.api import NodePool, parse_nodepool
from kubegpu.autoscaler.claims import DraWorld, uses_claims
from kubegpu.autoscaler.instancetypes import InstanceType, default_instance_types, load_instance_types
from kubegpu.autoscaler.provisioner import plan_summary, run_pass
from kubegpu.autoscaler.scheduler import NODE_COST, pod_problem
from kubegpu.cliopts import (
    FORMATS,
    OptionError,
    choice_option,
    duration_option,
    emit,
    legacy_alias,
    metrics_address_option,
    oneshot_option,
    output_option,
)
from kubegpu.errors import ConfigError
from kubegpu.files import parse_yaml_documents, read_text
from kubegpu.scheduling import node_info, parse_quantities

if TYPE_CHECKING:
    from kubegpu.autoscaler.controller import Autoscaler


def _check_node_cost(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"must be a non-negative number of $/h, got {value}")
    return value


def node_cost_option() -> Any:
    """`--node-cost`: what each new node costs beyond its price, in the plan's objective (docs/autoscaler.md)."""
    return typer.Option(NODE_COST, "--node-cost", callback=_check_node_cost,
                        help="$/h each new node costs beyond its price (its DaemonSets, the control plane's work per "
                             "node), weighed when sizing new nodes: fewer, fuller nodes (the default buys 8-GPU nodes "
                             "for a burst of mixed GPU pods). 0: the cheapest plan by price alone.")


def load_manifests(path: Path, kind: str) -> list[dict[str, Any]]:
    """Objects of `kind` from a YAML/JSON file: one object, a list, a `kind: List`, or several YAML documents."""
    docs = parse_yaml_documents(read_text(path), str(path))  # bounded, UTF-8, safe YAML
    items: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            items.extend(doc)
        elif isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            items.extend(doc.get("items") or [])
        else:
            items.append(doc)
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: [{i}]: expected a {kind} object, got {type(item).__name__}")
        if item.get("kind", kind) != kind:
            raise ConfigError(f"{path}: [{i}]: expected kind {kind}, got {item.get('kind')!r}")
        meta = item.get("metadata") or {}
        if not isinstance(meta, dict) or not meta.get("name"):
            raise ConfigError(f"{path}: [{i}].metadata.name: required")
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}" if kind == "Pod" else str(meta["name"])
        if key in seen:  # the API server keeps one object per name; a second would be counted twice
            raise ConfigError(f"{path}: [{i}].metadata.name: duplicate {kind} {key!r}")
        seen.add(key)
    return items


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _check_node(node: dict[str, Any], where: str) -> None:
    """The Node fields the scheduling simulation reads, checked so a malformed one is a line, not a traceback."""
    labels = node["metadata"].get("labels") or {}
    if not isinstance(labels, dict):
        raise ConfigError(f"{where}.metadata.labels: expected a mapping of label to value")
    taints = (node.get("spec") or {}).get("taints") or []
    if not isinstance(taints, list):
        raise ConfigError(f"{where}.spec.taints: expected a list")
    for k, taint in enumerate(taints):
        if not isinstance(taint, dict) or not taint.get("key") or taint.get("effect") not in _TAINT_EFFECTS:
            raise ConfigError(f"{where}.spec.taints[{k}]: expected {{key, value, effect}} with effect one of "
                              f"{', '.join(_TAINT_EFFECTS)}")
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    if not isinstance(allocatable, dict):
        raise ConfigError(f"{where}.status.allocatable: expected a mapping of resource to quantity")
    parse_quantities(allocatable, f"{where}.status.allocatable")


def load_nodepools(path: Path) -> list[NodePool]:
    pools = [parse_nodepool(raw, str(path)) for raw in load_manifests(path, "NodePool")]
    if not pools:
        raise ConfigError(f"{path}: no NodePool in the file")
    return pools


def _check_pods(pods: list[dict[str, Any]], path: Path) -> None:
    for pod in pods:
        why = pod_problem(pod)
        if why is not None:
            raise ConfigError(f"{path}: {why}")


PROVIDERS = ("kwok", "aws")
DRA_KINDS = ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate")


def load_dra(path: Path | None, pods: list[dict[str, Any]]) -> DraWorld | None:
    """The DRA objects the pods' claims name (`--dra`: DeviceClasses, ResourceClaims, ResourceClaimTemplates) beside
    kubegpu's shipped DeviceClasses; None when there is no file and no pod has claims (nothing to allocate)."""
    if path is None and not any(uses_claims(p) for p in pods):
        return None
    from kubegpu.dra.classes import shipped_class_objects

    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in DRA_KINDS}
    if path is not None:
        for i, doc in enumerate(d for d in parse_yaml_documents(read_text(path), str(path)) if d is not None):
            if not isinstance(doc, dict) or doc.get("kind") not in found:
                kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
                raise ConfigError(f"{path}: [{i}]: expected one of {', '.join(DRA_KINDS)}, got {kind!r}")
            found[str(doc["kind"])].append(doc)
    ours = {c["metadata"]["name"]: c for c in shipped_class_objects()}
    ours.update({str((c.get("metadata") or {}).get("name")): c for c in found["DeviceClass"]})
    return DraWorld(ours.values(), found["ResourceClaim"], found["ResourceClaimTemplate"])


def provision_command(
    nodepools: Path = typer.Option(..., "--nodepools", help="NodePool manifests (YAML/JSON, list or multi-doc)."),
    instance_types: Path | None = typer.Option(
        None, "--instance-types", help="Instance types in Karpenter's kwok JSON format (default: shipped catalogue)."),
    pods: Path = typer.Option(..., "--pods", help="Pending Pod manifests (YAML/JSON list or multi-doc)."),
    nodes: Path | None = typer.Option(None, "--nodes", help="Existing Node manifests; pods with nodeName count there."),
    dra: Path | None = typer.Option(None, "--dra", help="DeviceClasses, ResourceClaims and ResourceClaimTemplates "
                                    "the pods' claims name (kubegpu's DeviceClasses are always there)."),
    output: str = output_option("table", FORMATS),
    provider: str = choice_option("kwok", PROVIDERS, "--provider",
                                  help="Cloud provider: kwok (instance-type file) or aws (the account's types)."),
    region: str | None = typer.Option(None, "--region", help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION)."),
    nodeclasses: Path | None = typer.Option(None, "--nodeclasses", help="EC2NodeClass manifests (--provider aws)."),
    launch: bool = typer.Option(False, "--launch", help="Also launch the NodeClaims (--provider aws)."),
    cluster_name: str = typer.Option("kubegpu", "--cluster-name", help="Cluster name in the launch tags (aws)."),
    isolated_vpc: bool = typer.Option(False, "--isolated-vpc", help="No Pricing API: use the shipped price table."),
    node_cost: float = node_cost_option(),
) -> None:
    """Run one provisioning pass offline: which NodeClaims Karpenter-style provisioning would create, and why not."""
    from kubegpu.autoscaler.aws.cli import check_provider  # no boto3 import: kwok works without the extra

    check_provider(provider)
    if provider == "kwok" and (launch or nodeclasses):
        raise OptionError(f"{'--launch' if launch else '--nodeclasses'}: only with --provider aws")
    if provider == "aws" and instance_types:
        raise OptionError("--instance-types: only with --provider kwok (aws reads the account's instance types)")
    pools = load_nodepools(nodepools)
    aws = None
    if provider == "aws":
        from kubegpu.autoscaler.aws.cli import build_provider, check_pools
        from kubegpu.clock import RealClock

        aws = build_provider(region, nodeclasses, cluster_name, RealClock(), isolated_vpc=isolated_vpc)
        check_pools(pools, aws.nodeclasses, str(nodeclasses))
    types: list[InstanceType] = [] if aws else (
        load_instance_types(instance_types) if instance_types else default_instance_types())
    all_pods = load_manifests(pods, "Pod")
    _check_pods(all_pods, pods)
    existing_nodes = load_manifests(nodes, "Node") if nodes else []
    for i, node in enumerate(existing_nodes):
        _check_node(node, f"{nodes}: [{i}]")
    bound: dict[str, list[dict[str, Any]]] = {}
    pending: list[dict[str, Any]] = []
    for pod in all_pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        (bound.setdefault(node_name, []) if node_name else pending).append(pod)
    known = {n["metadata"]["name"] for n in existing_nodes}
    for node_name, on_node in bound.items():
        if node_name not in known:
            raise ConfigError(f"{pods}: pod {on_node[0]['metadata']['name']}: spec.nodeName {node_name!r} is not "
                              f"among the --nodes")
    infos = [node_info(n, bound.get(n["metadata"]["name"], [])) for n in existing_nodes]
    result = run_pass(pools, aws.instance_types if aws else lambda _pool: types, pending, infos,
                      not_ready=aws.pool_not_ready if aws else None, node_cost=node_cost,
                      dra=load_dra(dra, all_pods))
    summary = plan_summary(result)
    if aws is not None and launch:
        from kubegpu.autoscaler.aws.cli import launch as launch_claims
        from kubegpu.clock import RealClock

        summary = {"nodeclaims": launch_claims(aws, result, pools, RealClock().now()),
                   "unschedulable": summary["unschedulable"], "cost": summary["cost"]}
        if output != "table":
            emit(summary, output)
            return
        for row in summary["nodeclaims"]:
            typer.echo(f"{row['name']}\t{row['instanceType']}\t{row['zone']}\t{row['capacityType']}\t"
                       f"{row['providerID'] or row.get('error')}")
        return
    emit(summary, output, table=lambda: _print_table(summary))


def _print_table(summary: dict[str, Any]) -> None:
    console = Console()
    table = Table(title="NodeClaims")
    for column in ("nodepool", "instance type", "capacity", "zone", "$/h", "pods"):
        table.add_column(column)
    for claim in summary["nodeclaims"]:
        table.add_row(claim["nodepool"], claim["instanceType"], claim["capacityType"], claim["zone"],
                      f"{claim['price']:.4f}", str(len(claim["pods"])))
    console.print(table)
    console.print(f"total ${summary['cost']:.4f}/h")
    for entry in summary["unschedulable"]:  # one line each, whatever the width: a reason is read and grepped whole
        console.print(f"[red]unschedulable[/red] {escape(entry['namespace'])}/{escape(entry['pod'])}: "
                      f"{escape(entry['reason'])}", soft_wrap=True)


def autoscaler_command(
    instance_types: Path | None = typer.Option(
        None, "--instance-types", envvar="INSTANCE_TYPES_FILE_PATH",
        help="Instance types in kwok JSON format (default: shipped catalogue)."),
    registration_delay: float = duration_option(30.0, "--registration-delay",
                                                help="How long a new simulated node takes to register (kwok)."),
    batch_idle: float = duration_option(1.0, "--batch-idle-duration", positive=True, envvar="BATCH_IDLE_DURATION",
                                        help="A batch of pending pods closes this long after its last new pod."),
    batch_max: float = duration_option(10.0, "--batch-max-duration", positive=True, envvar="BATCH_MAX_DURATION",
                                       help="Longest a batch of pending pods stays open, from its first pod."),
    interval: float = duration_option(1.0, "--interval", positive=True, help="Time between passes."),
    disruption: bool = typer.Option(True, "--disruption/--no-disruption", help="Consolidate and expire nodes."),
    once: bool = oneshot_option(),
    metrics_address: str = metrics_address_option(
        ":8080", "HOST:PORT to serve Karpenter-named metrics on (empty: off)."),
    metrics_port: int | None = typer.Option(None, "--metrics-port", hidden=True,
                                            help="Deprecated spelling of --metrics-address :PORT (0: off)."),
    identity: str = typer.Option("", "--identity", help="Leader-election identity (default: host name)."),
    lease_namespace: str = typer.Option("kube-system", "--lease-namespace", help="Namespace of the leader Lease."),
    lease_duration: float = duration_option(15.0, "--lease-duration", positive=True,
                                            help="How long a leader holds the Lease."),
    provider: str = choice_option("kwok", PROVIDERS, "--provider",
                                  help="Cloud provider: kwok (simulated nodes) or aws (EC2 instances)."),
    region: str | None = typer.Option(None, "--region", help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION)."),
    nodeclasses: Path | None = typer.Option(
        None, "--nodeclasses", help="EC2NodeClass manifests (aws; default: the cluster's EC2NodeClass objects)."),
    interruption_queue: str | None = typer.Option(
        None, "--interruption-queue", envvar="INTERRUPTION_QUEUE", help="SQS queue name for interruption events."),
    cluster_name: str = typer.Option("kubegpu", "--cluster-name", envvar="CLUSTER_NAME",
                                     help="Cluster name in the launch tags (aws)."),
    isolated_vpc: bool = typer.Option(False, "--isolated-vpc", help="No Pricing API: use the shipped price table."),
    node_cost: float = node_cost_option(),
) -> None:
    """Run the GPU-aware autoscaler against the cluster (kubeconfig or in-cluster).

    Nodes come from the cloud provider named by --provider: kwok (kwok-style simulated nodes from an instance-type
    file) or aws (EC2 instances). Reads the cluster through informers (listed once, then watched). Replicas elect a
    leader through the kubegpu-autoscaler Lease; only the leader provisions, disrupts and terminates."""
    import socket

    from kubegpu.autoscaler.controller import LEASE_NAME, Autoscaler, Options
    from kubegpu.autoscaler.provider import SimulatedProvider
    from kubegpu.clock import RealClock
    from kubegpu.kube import LightkubeCluster
    from kubegpu.kube.leader import LeaderElector

    if batch_max < batch_idle:
        raise OptionError("--batch-max-duration: must be at least as long as --batch-idle-duration")
    if metrics_port is not None:  # the old flag keeps working: --metrics-port N is --metrics-address :N
        if not 0 <= metrics_port <= 65535:
            raise OptionError(f"--metrics-port: must be 0 (off) or a port 1..65535, got {metrics_port}")
        metrics_address = f":{metrics_port}" if metrics_port else ""
    from kubegpu.autoscaler.aws.cli import check_provider

    check_provider(provider)
    if provider == "kwok" and (interruption_queue or nodeclasses):
        raise OptionError(f"{'--interruption-queue' if interruption_queue else '--nodeclasses'}: only with "
                          "--provider aws")
    console = Console(stderr=True)
    cluster = LightkubeCluster()
    clock = RealClock()
    options = Options(batch_idle=batch_idle, batch_max=batch_max, disruption=disruption, parallelism=16,
                      node_cost=node_cost)
    elector = LeaderElector(cluster, identity or socket.gethostname(), LEASE_NAME, namespace=lease_namespace,
                            lease_duration=lease_duration)
    scaler: Autoscaler
    if provider == "aws":
        from kubegpu.autoscaler.aws.cli import build_autoscaler

        scaler = build_autoscaler(cluster, clock, options, elector, region=region, nodeclasses=nodeclasses,
                                  cluster_name=cluster_name, interruption_queue=interruption_queue,
                                  isolated_vpc=isolated_vpc, log=lambda line: console.log(line))
    else:
        types = load_instance_types(instance_types) if instance_types else default_instance_types()
        scaler = Autoscaler(cluster, SimulatedProvider(cluster, types, clock, registration_delay,
                                                     parallelism=options.parallelism), clock, options,
                            log=lambda line: console.log(line), elector=elector)
    if once:
        scaler.step()
        return
    if metrics_address:
        serve_autoscaler_metrics(scaler, metrics_address)

    async def run_until_signalled() -> None:
        """SIGTERM/SIGINT end the loop after the pass in progress (no half-recorded NodeClaim launch)."""
        import signal

        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await scaler.run(interval, stop)

    asyncio.run(run_until_signalled())


def serve_autoscaler_metrics(scaler: Autoscaler, address: str) -> int:
    """Serve the autoscaler's `/metrics` and `/readyz` on `address`; returns the bound port. `/readyz` answers 503
    while an informer's watch has been broken past the bound, the same check that makes every stage skip its pass,
    so a readinessProbe sees what the controller sees."""
    from kubegpu.kube.informer import cache_trusted
    from kubegpu.metrics import serve_metrics

    return serve_metrics(address, scaler.metrics.registry, ready=lambda: cache_trusted(scaler.cluster))


def _looks_like_nodepool(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == "NodePool"


def _validate_nodepool(data: object, source: str, _options: object) -> str:
    pool = parse_nodepool(data, source)
    return f"weight {pool.weight}, {len(pool.spec.template.spec.requirements)} requirements"


def register_validators() -> None:
    """Let `kubegpu validate-config` check NodePool manifests."""
    from kubegpu.config import register_validator

    register_validator("NodePool", _looks_like_nodepool, _validate_nodepool)
    from kubegpu.autoscaler.aws.nodeclass import looks_like_ec2nodeclass, validate_ec2nodeclass

    register_validator("EC2NodeClass", looks_like_ec2nodeclass, validate_ec2nodeclass)


def register(app: typer.Typer) -> None:
    app.command("provision")(provision_command)
    app.command("autoscaler")(autoscaler_command)
    legacy_alias("autoscaler", "--once", "--oneshot")
    register_validators()
