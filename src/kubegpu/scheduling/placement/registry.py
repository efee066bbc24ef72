"""Placement policies by name, and `choose`: the one entry point the simulator and the cluster adapter call.

A policy is an object with `choose(request, state) -> Placement | None`; it never mutates the state (the caller
applies the placement it accepts). A policy may keep what it learns from the requests it is asked about (the
popularity of task shapes, say), so one instance serves one cluster's stream of decisions. Factories take a
`PolicyContext`: the seed for its random choices and the workload it may assume (the task mix the operator expects;
empty when unknown).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kubegpu.errors import ConfigError
from kubegpu.scheduling.placement.model import ClusterState, Placement, Request


class Policy(Protocol):
    """Decides where one request goes on the state as it is now, or None when it fits nowhere."""

    def choose(self, request: Request, state: ClusterState) -> Placement | None: ...


@dataclass(frozen=True)
class PolicyContext:
    """What a policy is built with: the seed of its random choices and the expected workload (may be empty)."""

    seed: int = 0
    workload: Sequence[Request] = field(default_factory=tuple)


PolicyFactory = Callable[[PolicyContext], Policy]
_POLICIES: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make a policy available by name (the built-in ones register on import of the package)."""
    _POLICIES[name] = factory


def policy_names() -> list[str]:
    """The registered policy names, sorted."""
    return sorted(_POLICIES)


def make_policy(name: str, context: PolicyContext | None = None) -> Policy:
    """A fresh instance of the named policy; ConfigError naming the choices when there is none by that name."""
    factory = _POLICIES.get(name)
    if factory is None:
        raise ConfigError(f"placement policy {name!r} is not one of {', '.join(policy_names())}")
    return factory(context or PolicyContext())


def choose(request: Request, state: ClusterState, policy: Policy) -> Placement | None:
    """Where the policy puts the request now, checked: the placement fits the state, or None when nothing fits.

    The state is not changed; call `state.apply(request, placement)` to take the resources.
    """
    placement = policy.choose(request, state)
    if placement is not None and not state.fits(request, placement):
        raise ConfigError(f"policy {type(policy).__name__} chose {placement}, which does not fit {request}")
    return placement
