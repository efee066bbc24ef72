"""NodePool / NodeClaim models: Karpenter v1 defaults and validation, one line with the field path when invalid."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kubegpu.autoscaler.api import Budget, parse_duration, parse_nodepool
from kubegpu.autoscaler.cron import CronSchedule
from kubegpu.errors import ConfigError
from tests.autoscaler.builders import nodepool


def test_defaults_match_karpenter_v1() -> None:
    pool = parse_nodepool(nodepool("gpu"))
    assert pool.spec.disruption.consolidationPolicy == "WhenEmptyOrUnderutilized"
    assert pool.spec.disruption.consolidateAfter == "0s"
    assert [b.nodes for b in pool.spec.disruption.budgets] == ["10%"]
    assert pool.spec.template.spec.expireAfter == "720h"
    assert pool.spec.template.spec.terminationGracePeriod is None
    assert pool.weight == 0


def test_limits_accept_any_resource_including_gpus() -> None:
    pool = parse_nodepool(nodepool("gpu", limits={"cpu": "1000", "memory": "1000Gi", "nvidia.com/gpu": "16",
                                                  "nodes": 3}))
    assert pool.spec.limits["nvidia.com/gpu"] == "16"


@pytest.mark.parametrize(
    ("requirement", "fragment"),
    [
        ({"key": "a", "operator": "In", "values": []}, "requirements[0]: operator In needs at least one value"),
        ({"key": "a", "operator": "Gt", "values": ["x"]}, "requirements[0]: operator Gt needs exactly one value"),
        ({"key": "a", "operator": "Lt", "values": ["1", "2"]}, "operator Lt needs exactly one value"),
        ({"key": "a", "operator": "Exists", "values": ["1"]}, "operator Exists takes no values"),
        ({"key": "a", "operator": "NotIn", "values": ["1"], "minValues": 1}, "minValues is only allowed with"),
        ({"key": "a", "operator": "In", "values": ["1"], "minValues": 2}, "minValues 2 is more than the 1 values"),
        ({"key": "a", "operator": "Near", "values": ["1"]}, "requirements[0].operator"),
        ({"key": "kubernetes.io/hostname", "operator": "In", "values": ["n"]}, "is restricted"),
    ],
)
def test_invalid_requirement_is_one_line_with_field_path(requirement: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_nodepool(nodepool("bad", [requirement]), "pools.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("pools.yaml: NodePool bad: spec.template.spec.")
    assert fragment in message


@pytest.mark.parametrize(
    ("disruption", "fragment"),
    [
        ({"budgets": [{"nodes": "110%"}]}, "spec.disruption.budgets[0].nodes"),
        ({"budgets": [{"nodes": "1", "schedule": "0 9 * * mon-fri"}]}, "schedule and duration must be set together"),
        ({"budgets": [{"nodes": "1", "schedule": "0 9 * *", "duration": "8h"}]}, "budgets[0].schedule"),
        ({"budgets": [{"nodes": "1", "schedule": "@daily", "duration": "10s"}]}, "hours and minutes only"),
        ({"budgets": [{"nodes": "1", "reasons": ["Bored"]}]}, "budgets[0].reasons[0]"),
        ({"consolidationPolicy": "Sometimes"}, "spec.disruption.consolidationPolicy"),
        ({"consolidateAfter": "5 minutes"}, "spec.disruption.consolidateAfter"),
    ],
)
def test_invalid_disruption_settings(disruption: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match="NodePool bad") as err:
        parse_nodepool(nodepool("bad", disruption=disruption))
    assert fragment in str(err.value)


def test_weight_range_and_restricted_template_labels() -> None:
    with pytest.raises(ConfigError, match=r"spec\.weight"):
        parse_nodepool(nodepool("w", weight=101))
    with pytest.raises(ConfigError, match=r"metadata\.labels: .*kubegpu\.io/nodepool"):
        parse_nodepool(nodepool("l", labels={"kubegpu.io/nodepool": "x"}))


def test_durations() -> None:
    assert parse_duration("720h") == 720 * 3600
    assert parse_duration("1h30m10s") == 5410
    assert parse_duration("Never") is None
    with pytest.raises(ValueError):
        parse_duration("1d")


def test_budget_percentages_round_up() -> None:
    assert Budget(nodes="10%").allowed(5) == 1
    assert Budget(nodes="10%").allowed(11) == 2
    assert Budget(nodes="0").allowed(50) == 0
    assert Budget(nodes="3").allowed(2) == 3


def test_scheduled_budget_active_only_inside_window() -> None:
    budget = Budget(nodes="0", schedule="0 9 * * mon-fri", duration="8h")
    monday_10 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    monday_18 = datetime(2026, 11, 23, 18, 0, tzinfo=UTC)
    sunday_10 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    assert budget.active(monday_10)
    assert not budget.active(monday_18)
    assert not budget.active(sunday_10)
    assert Budget(nodes="1").active(sunday_10)


def test_cron_macros_and_lists() -> None:
    assert CronSchedule.parse("@hourly").matches(datetime(2026, 1, 1, 5, 0, tzinfo=UTC))
    every_15 = CronSchedule.parse("*/15 * * * *")
    assert every_15.matches(datetime(2026, 1, 1, 5, 45, tzinfo=UTC))
    assert not every_15.matches(datetime(2026, 1, 1, 5, 46, tzinfo=UTC))
    with pytest.raises(ValueError):
        CronSchedule.parse("61 * * * *")
