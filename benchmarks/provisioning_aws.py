"""Provisioning with instance types discovered from a local AWS endpoint (moto): pods/s and cost vs the optimum.

    python benchmarks/provisioning_aws.py [--quick] [--sizes 1000,5000] [--seed 42]

Starts moto's ThreadedMotoServer on 127.0.0.1 (dummy credentials; nothing leaves the machine), builds a VPC with
two tagged subnets, and lets the AWS provider discover every instance type moto knows (1,395, 65 with GPUs),
their zone offerings and prices (the shipped table, else the resource-based estimate; on-demand only, because
moto's spot prices are a flat placeholder). The GPU pod mix and pools are those of benchmarks/provisioning.py,
pointed at the EC2NodeClass. Reports the pass's pods/s, its cost against the LP lower bound, and on small
instances the cost against the exact MILP optimum.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provisioning import gpu_pods, gpu_pools, lp_lower_bound, milp_optimum, report
from kubegpu.autoscaler.api import NodePool
from kubegpu.autoscaler.aws.provider import AwsProvider
from kubegpu.autoscaler.gpu_capacity import CapacityModel
from kubegpu.autoscaler.instancetypes import InstanceType
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.autoscaler.requirements import Requirements
from kubegpu.clock import RealClock


def aws_pools() -> list[NodePool]:
    pools = []
    for pool in gpu_pools():
        pool.spec.template.spec.nodeClassRef.kind = "EC2NodeClass"
        pool.spec.template.spec.nodeClassRef.name = "gpu"
        from kubegpu.autoscaler.api import NodeSelectorRequirementWithMinValues as Req

        pool.spec.template.spec.requirements.append(Req(key="kubegpu.io/capacity-type", operator="In",
                                                        values=["on-demand"]))
        pools.append(pool)
    return pools


def on_demand_options(pools: Sequence[NodePool], types: Sequence[InstanceType],
                      model: CapacityModel) -> list[tuple[float, dict[str, float]]]:
    """Every (on-demand price, allocatable) a node could have: the bound's options (moto's spot prices are fake)."""
    out = []
    for pool in pools:
        reqs = Requirements.from_api([r.model_dump(exclude_none=True) for r in pool.spec.template.spec.requirements
                                      if r.key != "kubegpu.io/capacity-type"])   # an offering's, not a label
        for it in types:
            if not reqs.satisfied_by({k: v for k, v in it.labels.items() if reqs.get(k) is not None}):
                continue
            offer = it.cheapest_offering(lambda o: o.capacity_type == "on-demand")
            if offer is not None:
                out.append((offer.price, dict(model(pool, it))))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([200, 1000] if args.quick else [1000, 5000])
    from moto.server import ThreadedMotoServer

    from kubegpu.autoscaler.aws.clients import make_clients
    from kubegpu.autoscaler.aws.nodeclass import parse_ec2nodeclass

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_ENDPOINT_URL=f"http://{host}:{port}")
    try:
        clients = make_clients("us-east-1", max_attempts=1)
        ec2 = clients.ec2
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        for i, zone in enumerate(("us-east-1a", "us-east-1b")):
            subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=zone)["Subnet"]
            ec2.create_tags(Resources=[subnet["SubnetId"]], Tags=[{"Key": "bench", "Value": "yes"}])
        group = ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        nodeclass = parse_ec2nodeclass({"metadata": {"name": "gpu"}, "spec": {
            "amiFamily": "AL2023", "amiSelectorTerms": [{"id": image}], "role": "bench",
            "subnetSelectorTerms": [{"tags": {"bench": "yes"}}], "securityGroupSelectorTerms": [{"id": group}]}})
        provider = AwsProvider(clients, "bench", {"gpu": nodeclass}, RealClock(), use_pricing_api=False)
        pools = aws_pools()
        start = time.perf_counter()
        types = provider.types.list(provider.nodeclass("gpu"))
        print(f"discovered {len(provider.types.describe_types())} instance types ({len(types)} offered in the "
              f"subnets' zones, {sum(1 for t in types if t.gpu_count)} with GPUs) in "
              f"{time.perf_counter() - start:.1f} s")
        options = on_demand_options(pools, types, CapacityModel())
        for size in sizes:
            pods = gpu_pods(size, random.Random(args.seed))
            start = time.perf_counter()
            result = run_pass(pools, provider.instance_types, pods)
            report("aws", pods, result, time.perf_counter() - start, lp_lower_bound(pods, options))
        ratios = []
        for k in range(2 if args.quick else 5):
            pods = gpu_pods(8, random.Random(args.seed + k))
            result = run_pass(pools, provider.instance_types, pods)
            ratios.append(result.cost / milp_optimum(pods, options))
        print("small instances, cost / exact MILP optimum: " + ", ".join(f"{r:.3f}" for r in ratios))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
