"""A moto server on 127.0.0.1 for the AWS provider tests, plus a small account: a VPC, two tagged subnets in
two zones, a tagged security group and AL2023 alias parameters under a test SSM prefix (moto, like AWS, refuses
parameters under `/aws/`). Every call goes through real boto3 HTTP to the local server; nothing leaves 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kubegpu.autoscaler.aws.clients import AwsClients, make_clients

REGION = "us-east-1"
SSM_PREFIX = "/test/aws/service"
K8S = "1.33"
DISCOVERY = {"karpenter.sh/discovery": "gpu-cluster"}


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A ThreadedMotoServer on a free local port, with dummy credentials and AWS_ENDPOINT_URL pointing at it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith(("AWS_ENDPOINT_URL", "AWS_PROFILE"))]:
            mp.delenv(key)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_SESSION_TOKEN", "testing")
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        mp.setenv("AWS_ENDPOINT_URL", url)
        try:
            yield url
        finally:
            server.stop()


def reset(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).read()


@dataclass
class Account:
    clients: AwsClients
    subnets: dict[str, str]      # zone → subnet id
    security_group: str
    amis: dict[str, str]         # "standard" / "nvidia" → AMI id (x86_64)


_AMIS: list[str] = []


def default_amis(ec2: Any) -> list[str]:
    """Three of moto's built-in x86_64 AMIs (the same after every reset; listing them costs a second, so once)."""
    if not _AMIS:
        images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
        _AMIS.extend(sorted(i["ImageId"] for i in images["Images"])[:3])
    return _AMIS


def build_account(clients: AwsClients) -> Account:
    ec2, ssm = clients.ec2, clients.ssm
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = {}
    # /20: moto does not give a terminated instance's address back, and one module's crash-point runs (one per write
    # of a scenario, each launching its nodes afresh) launch more than a /24 holds
    for i, zone in enumerate(("us-east-1a", "us-east-1b")):
        sid = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{16 * i}.0/20",
                                AvailabilityZone=zone)["Subnet"]["SubnetId"]
        ec2.create_tags(Resources=[sid], Tags=[{"Key": k, "Value": v} for k, v in DISCOVERY.items()])
        subnets[zone] = sid
    other = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.144.0/24", AvailabilityZone="us-east-1c")["Subnet"]
    assert other["SubnetId"] not in subnets.values()  # untagged: never selected
    sg = ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[sg], Tags=[{"Key": k, "Value": v} for k, v in DISCOVERY.items()])
    amis = {"standard": default_amis(ec2)[0], "nvidia": default_amis(ec2)[1]}
    for variant, ami in amis.items():
        path = f"{SSM_PREFIX}/eks/optimized-ami/{K8S}/amazon-linux-2023/x86_64/{variant}/recommended/image_id"
        ssm.put_parameter(Name=path, Value=ami, Type="String")
    return Account(clients, subnets, sg, amis)


def nodeclass_manifest(name: str = "gpu", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": dict(DISCOVERY)}],
        "securityGroupSelectorTerms": [{"tags": dict(DISCOVERY)}],
        "role": "KarpenterNodeRole-gpu-cluster",
        "tags": {"team": "ml"},
    }
    body.update(spec)
    return {"apiVersion": "kubegpu.io/v1", "kind": "EC2NodeClass", "metadata": {"name": name}, "spec": body}


def clients() -> AwsClients:
    return make_clients(REGION, max_attempts=1)
