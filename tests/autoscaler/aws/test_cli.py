"""`kubegpu provision --provider aws [--nodeclasses FILE] [--launch]` against moto's local server."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.autoscaler.aws import labels as A
from tests.autoscaler.aws.moto_env import Account, nodeclass_manifest
from tests.autoscaler.builders import nodepool, pod
from tests.autoscaler.test_cli import invoke


@pytest.fixture
def account(account: Account, monkeypatch: pytest.MonkeyPatch) -> Account:
    """The package's fresh account, with the CLI's instance-type list narrowed to what the tests use."""
    monkeypatch.setenv("KUBEGPU_AWS_INSTANCE_TYPES", "g5.*,g4dn.xlarge,m5.large,m5.xlarge")
    return account


def write(tmp_path: Path, account: Account, pools: list[dict[str, Any]], pods: list[dict[str, Any]],
          **nodeclass: Any) -> list[str]:
    spec = {"amiFamily": "AL2023", "amiSelectorTerms": [{"id": account.amis["nvidia"]}], **nodeclass}
    paths = {"pools.yaml": pools, "pods.yaml": pods, "classes.yaml": [nodeclass_manifest(**spec)]}
    for name, docs in paths.items():
        (tmp_path / name).write_text(yaml.safe_dump_all(docs))
    return ["--provider", "aws", "--region", "us-east-1", "--nodepools", str(tmp_path / "pools.yaml"),
            "--pods", str(tmp_path / "pods.yaml"), "--nodeclasses", str(tmp_path / "classes.yaml")]


def gpu_pool(*requirements: dict[str, Any]) -> dict[str, Any]:
    manifest = nodepool("gpu", list(requirements))
    manifest["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "kubegpu.io", "kind": "EC2NodeClass",
                                                            "name": "gpu"}
    return manifest


def gpu_pods(n: int) -> list[dict[str, Any]]:
    return [pod(f"train-{i}", cpu="2", memory="8Gi", limits={"nvidia.com/gpu": "1"}) for i in range(n)]


A10G = {"key": A.INSTANCE_GPU_NAME, "operator": "In", "values": ["a10g"]}
ON_DEMAND = {"key": "kubegpu.io/capacity-type", "operator": "In", "values": ["on-demand"]}


def test_provision_launch_prints_every_nodeclaim_with_its_provider_id(tmp_path: Path, account: Account) -> None:
    args = write(tmp_path, account, [gpu_pool(A10G, ON_DEMAND)], gpu_pods(3))
    code, out = invoke("provision", *args, "--launch", "-o", "json", "--cluster-name", "trial")
    assert code == 0, out
    # moto's in-process server prints its "no backend for pricing" note to stdout; the CLI then uses the table
    assert "Unable to find appropriate backend for pricing" in out
    claims = json.loads(out[out.index("{"):])["nodeclaims"]
    assert claims and all(set(c) == {"name", "instanceType", "zone", "capacityType", "providerID"} for c in claims)
    running = account.clients.ec2.describe_instances(
        Filters=[{"Name": "tag:kubernetes.io/cluster/trial", "Values": ["owned"]}])["Reservations"]
    instances = {i["InstanceId"]: i for r in running for i in r["Instances"]}
    assert len(instances) == len(claims)
    for claim in claims:
        assert claim["instanceType"].startswith("g5.") and claim["capacityType"] == "on-demand"
        zone, instance_id = claim["providerID"].removeprefix("aws:///").split("/")
        assert zone == claim["zone"] and instances[instance_id]["InstanceType"] == claim["instanceType"]


def test_provision_without_launch_plans_but_launches_nothing(tmp_path: Path, account: Account) -> None:
    args = write(tmp_path, account, [gpu_pool(A10G, ON_DEMAND)], gpu_pods(2))
    code, out = invoke("provision", *args, "-o", "json", "--isolated-vpc")
    assert code == 0, out
    summary = json.loads(out)
    assert summary["nodeclaims"] and all(c["instanceType"].startswith("g5.") for c in summary["nodeclaims"])
    assert account.clients.ec2.describe_instances()["Reservations"] == []


def test_nodepool_pointing_at_a_missing_nodeclass_is_one_line(tmp_path: Path, account: Account) -> None:
    pool = gpu_pool(A10G)
    pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] = "missing"
    code, out = invoke("provision", *write(tmp_path, account, [pool], gpu_pods(1)), "--isolated-vpc")
    assert code == 1
    assert out.strip().splitlines() == [f"error: NodePool gpu: spec.template.spec.nodeClassRef.name: EC2NodeClass "
                                        f"'missing' is not in {tmp_path / 'classes.yaml'}"]


def test_invalid_nodeclass_names_the_field(tmp_path: Path, account: Account) -> None:
    args = write(tmp_path, account, [gpu_pool(A10G)], gpu_pods(1), instanceProfile="profile")
    code, out = invoke("provision", *args)
    assert code == 1
    assert out.strip() == (f"error: {tmp_path / 'classes.yaml'}: EC2NodeClass gpu: spec: must specify exactly one "
                           "of ['role', 'instanceProfile']")


def test_launch_needs_the_aws_provider(tmp_path: Path, account: Account) -> None:
    args = write(tmp_path, account, [nodepool("gpu")], gpu_pods(1))
    args[1] = "kwok"
    code, out = invoke("provision", *args, "--launch")
    assert code == 2 and "only with --provider aws" in out


def test_missing_boto3_names_the_extra(tmp_path: Path, account: Account, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)   # what `import boto3` sees without the extra
    code, out = invoke("provision", *write(tmp_path, account, [gpu_pool(A10G)], gpu_pods(1)))
    assert code == 1
    assert out.strip() == "error: the aws provider needs boto3: pip install 'kubegpu[aws]'"
