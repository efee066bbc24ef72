"""Fixtures every AWS provider test shares: one moto server for the package, a fresh account per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.autoscaler.aws.moto_env import Account, build_account, clients, moto_server, reset


@pytest.fixture(scope="package")
def server() -> Iterator[str]:
    """One ThreadedMotoServer for the whole package: starting one costs about a second, `reset` is cheap."""
    with moto_server() as url:
        yield url


@pytest.fixture
def account(server: str) -> Account:
    """A clean moto state with the VPC, tagged subnets, security group and AMI parameters the tests expect."""
    reset(server)
    return build_account(clients())
