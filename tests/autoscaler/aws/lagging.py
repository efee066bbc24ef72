"""moto's EC2 as EC2 answers right after a launch: DescribeInstances by instance id says
`InvalidInstanceID.NotFound` for `lag` seconds (of the test's virtual clock) after RunInstances or CreateFleet
started the instance, as EC2's eventually consistent reads do. Everything else is moto's."""

from __future__ import annotations

import math
from typing import Any

from botocore.exceptions import ClientError

from kubegpu.autoscaler.aws.clients import AwsClients
from kubegpu.clock import Clock


class LaggingEc2:
    def __init__(self, ec2: Any, clock: Clock, lag: float) -> None:
        self._ec2, self._clock, self.lag = ec2, clock, lag
        self.launched: dict[str, float] = {}   # instance id → when it was launched (virtual time)
        self.not_found = 0                     # answers faked

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ec2, name)

    def _note(self, ids: list[str]) -> None:
        for instance_id in ids:
            self.launched[instance_id] = self._clock.now()

    def create_fleet(self, **kwargs: Any) -> Any:
        answer = self._ec2.create_fleet(**kwargs)
        self._note([i for group in answer.get("Instances") or [] for i in group.get("InstanceIds") or []])
        return answer

    def run_instances(self, **kwargs: Any) -> Any:
        answer = self._ec2.run_instances(**kwargs)
        self._note([i["InstanceId"] for i in answer["Instances"]])
        return answer

    def describe_instances(self, **kwargs: Any) -> Any:
        now = self._clock.now()
        for instance_id in kwargs.get("InstanceIds") or []:
            if now - self.launched.get(instance_id, -math.inf) < self.lag:
                self.not_found += 1
                raise ClientError({"Error": {"Code": "InvalidInstanceID.NotFound",
                                             "Message": f"The instance ID '{instance_id}' does not exist"}},
                                  "DescribeInstances")
        return self._ec2.describe_instances(**kwargs)


def lagging(clients: AwsClients, clock: Clock, lag: float) -> tuple[AwsClients, LaggingEc2]:
    """Clients whose EC2 lags (`LaggingEc2`); the other services are the given clients'."""
    ec2 = LaggingEc2(clients.ec2, clock, lag)
    return AwsClients(clients.region, lambda service, region: ec2 if service == "ec2" else
                      clients.client(service, region)), ec2
