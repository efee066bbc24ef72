"""What `kubegpu provision` and `kubegpu autoscaler` need for `--provider aws`, kept out of the shared CLI module.

`KUBEGPU_AWS_INSTANCE_TYPES` (comma-separated, wildcards allowed, e.g. `g5.*,m5.*`) narrows DescribeInstanceTypes,
which keeps trials against a test endpoint quick; unset, every type the account offers is considered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler.api import NodePool
from kubegpu.autoscaler.aws.nodeclass import EC2NodeClass, load_nodeclasses
from kubegpu.autoscaler.aws.provider import AwsProvider
from kubegpu.autoscaler.provider import InsufficientCapacityError
from kubegpu.autoscaler.templates import SchedulingResult
from kubegpu.clock import Clock
from kubegpu.errors import ConfigError, KubegpuError

if TYPE_CHECKING:
    from kubegpu.autoscaler.controller import Autoscaler, Options
    from kubegpu.kube import Cluster
    from kubegpu.kube.leader import LeaderElector

TYPES_ENV = "KUBEGPU_AWS_INSTANCE_TYPES"
PROVIDERS = ("kwok", "aws")


def check_provider(provider: str) -> None:
    if provider not in PROVIDERS:
        raise ConfigError(f"--provider: must be kwok or aws, got {provider!r}")


def type_patterns() -> list[str]:
    return [p.strip() for p in os.environ.get(TYPES_ENV, "").split(",") if p.strip()]


def check_pools(pools: Sequence[NodePool], classes: Mapping[str, EC2NodeClass], source: str) -> None:
    """Every NodePool must point at an EC2NodeClass in the file: one line naming the pool otherwise."""
    for pool in pools:
        ref = pool.spec.template.spec.nodeClassRef
        if ref.kind != "EC2NodeClass":
            raise ConfigError(f"NodePool {pool.name}: spec.template.spec.nodeClassRef.kind: must be EC2NodeClass "
                              f"with --provider aws, got {ref.kind!r}")
        if ref.name not in classes:
            raise ConfigError(f"NodePool {pool.name}: spec.template.spec.nodeClassRef.name: EC2NodeClass "
                              f"{ref.name!r} is not in {source}")


def build_provider(region: str | None, nodeclasses: Path | None, cluster_name: str, clock: Clock,
                   log: Callable[[str], None] | None = None, isolated_vpc: bool = False,
                   required: bool = True) -> AwsProvider:
    """An AwsProvider for the CLI: boto3 clients (one-line error without the extra), classes from the file."""
    from kubegpu.autoscaler.aws.clients import make_clients

    if nodeclasses is None and required:
        raise ConfigError("--nodeclasses: required with --provider aws (EC2NodeClass manifests)")
    classes = load_nodeclasses(nodeclasses) if nodeclasses else {}
    clients = make_clients(region)
    return AwsProvider(clients, cluster_name, classes, clock, type_patterns=type_patterns(),
                       use_pricing_api=not isolated_vpc, log=log)


def launch(provider: AwsProvider, result: SchedulingResult, pools: Sequence[NodePool],
           now: float) -> list[dict[str, Any]]:
    """Create every planned NodeClaim's instance; the rows `provision --launch` prints (and errors per claim)."""
    from kubegpu.autoscaler.provisioner import nodeclaim_object

    by_name = {p.name: p for p in pools}
    rows: list[dict[str, Any]] = []
    for i, plan in enumerate(result.claims):
        claim = nodeclaim_object(plan, by_name[plan.nodepool], f"{plan.nodepool}-{i:04d}", now)
        try:
            done = provider.create(claim)
        except InsufficientCapacityError as exc:
            rows.append({"name": claim["metadata"]["name"], "instanceType": None, "zone": None,
                         "capacityType": None, "providerID": None, "error": str(exc)})
            continue
        except KubegpuError as exc:
            raise KubegpuError(f"nodeclaim {claim['metadata']['name']}: launch failed: {exc}") from None
        labels = done["metadata"]["labels"]
        from kubegpu.autoscaler import labels as L

        rows.append({"name": done["metadata"]["name"], "instanceType": labels.get(L.INSTANCE_TYPE_LABEL),
                     "zone": labels.get(L.ZONE_LABEL), "capacityType": labels.get(L.CAPACITY_TYPE_LABEL),
                     "providerID": done["status"]["providerID"]})
    return rows


def build_autoscaler(cluster: Cluster, clock: Clock, options: Options, elector: LeaderElector | None, *,
                     region: str | None, nodeclasses: Path | None, cluster_name: str,
                     interruption_queue: str | None, isolated_vpc: bool,
                     log: Callable[[str], None] | None = None) -> Autoscaler:
    """`kubegpu autoscaler --provider aws`: classes from --nodeclasses, else from the cluster's EC2NodeClasses."""
    from kubegpu.autoscaler.aws.upkeep import aws_autoscaler

    provider = build_provider(region, nodeclasses, cluster_name, clock, log, isolated_vpc, required=False)
    return aws_autoscaler(cluster, provider, clock, options, log, elector, interruption_queue=interruption_queue,
                          nodeclasses_from_cluster=nodeclasses is None)
