"""boto3 clients for the provider: region from the flag or the AWS environment, endpoint from `AWS_ENDPOINT_URL`.

boto3 reads `AWS_ENDPOINT_URL` (and `AWS_ENDPOINT_URL_EC2`, ...) itself, which is how the tests point every call at
moto's local server; nothing here hard-codes an endpoint. API errors become one-line `KubegpuError`s carrying the
AWS error code, so callers can tell capacity errors from "not found" without importing botocore.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import ConfigError, KubegpuError

EXTRA_HINT = "the aws provider needs boto3: pip install 'kubegpu[aws]'"


class AwsApiError(KubegpuError):
    """An AWS API call failed; `code` is the AWS error code (e.g. InvalidInstanceID.NotFound)."""

    def __init__(self, operation: str, code: str, message: str) -> None:
        super().__init__(f"{operation}: {code}: {message}")
        self.operation = operation
        self.code = code


def require_boto3() -> Any:
    """The boto3 module, or a one-line ConfigError naming the extra to install."""
    try:
        import boto3
    except ImportError:
        raise ConfigError(EXTRA_HINT) from None
    return boto3


def resolve_region(region: str | None) -> str:
    """`--region`, else AWS_REGION / AWS_DEFAULT_REGION; ConfigError when none is set."""
    found = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not found:
        raise ConfigError("--region: no AWS region (pass --region or set AWS_REGION / AWS_DEFAULT_REGION)")
    return found


def pricing_region(region: str) -> str:
    """The Pricing API's endpoint region for a cluster region (Karpenter's choice)."""
    if region.startswith("ap-"):
        return "ap-south-1"
    if region.startswith("eu-"):
        return "eu-central-1"
    if region.startswith("cn-"):
        return "cn-northwest-1"
    return "us-east-1"


@dataclass
class AwsClients:
    """The clients one provider uses; built lazily so a run that never needs SQS or Pricing never creates them."""

    region: str
    factory: Callable[[str, str], Any]
    _cache: dict[tuple[str, str], Any] = field(default_factory=dict)

    def client(self, service: str, region: str | None = None) -> Any:
        key = (service, region or self.region)
        if key not in self._cache:
            self._cache[key] = self.factory(service, key[1])
        return self._cache[key]

    @property
    def ec2(self) -> Any:
        return self.client("ec2")

    @property
    def sqs(self) -> Any:
        return self.client("sqs")

    @property
    def ssm(self) -> Any:
        return self.client("ssm")

    @property
    def pricing(self) -> Any:
        return self.client("pricing", pricing_region(self.region))


def make_clients(region: str | None = None, max_attempts: int = 3) -> AwsClients:
    """Clients for `region` (or the environment's); ConfigError when boto3 is missing or no region is known."""
    boto3 = require_boto3()
    from botocore.config import Config

    name = resolve_region(region)
    config = Config(retries={"max_attempts": max_attempts, "mode": "standard"})

    once = Config(retries={"max_attempts": 1, "mode": "standard"})

    def factory(service: str, where: str) -> Any:
        # Pricing has a shipped fallback table: one try, no backoff delaying the first provisioning pass
        return boto3.client(service, region_name=where, config=once if service == "pricing" else config)

    return AwsClients(name, factory)


def call(client: Any, operation: str, **kwargs: Any) -> Any:
    """`client.<operation>(**kwargs)`; a botocore error becomes AwsApiError with the AWS code."""
    from botocore.exceptions import BotoCoreError, ClientError

    method = getattr(client, operation)
    try:
        return method(**kwargs)
    except ClientError as exc:
        err = exc.response.get("Error") or {}
        raise AwsApiError(operation, str(err.get("Code") or "Unknown"), str(err.get("Message") or "")) from None
    except BotoCoreError as exc:
        raise AwsApiError(operation, type(exc).__name__, str(exc).splitlines()[0]) from None


def paginate(client: Any, operation: str, key: str, **kwargs: Any) -> list[Any]:
    """Every item under `key` across all pages (real APIs page even where moto does not)."""
    from botocore.exceptions import BotoCoreError, ClientError

    out: list[Any] = []
    try:
        for page in client.get_paginator(operation).paginate(**kwargs):
            out.extend(page.get(key) or [])
    except ClientError as exc:
        err = exc.response.get("Error") or {}
        raise AwsApiError(operation, str(err.get("Code") or "Unknown"), str(err.get("Message") or "")) from None
    except BotoCoreError as exc:
        raise AwsApiError(operation, type(exc).__name__, str(exc).splitlines()[0]) from None
    return out
