"""What benchmarks/karpenter_e2e.py feeds both autoscalers: one instance-types file that both read as the shipped
catalogue, and the issue's burst (per 10 GPU pods 4 x 1 GPU, 3 x 2, 2 x 4, 1 x 8; optional CPU-only share)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import karpenter_e2e as e2e
from kubegpu.autoscaler.catalog import shipped_catalogue
from kubegpu.autoscaler.instancetypes import load_instance_types


def test_the_instance_types_file_is_the_shipped_catalogue_under_karpenters_capacity_key(tmp_path: Path) -> None:
    path = tmp_path / "types.json"
    entries = e2e.write_types(path)
    raw = json.loads(path.read_text())
    assert raw == entries
    keys = {r["key"] for entry in raw for o in entry["offerings"] for r in o["Requirements"]}
    # Karpenter's kwok provider reads exactly these keys; kubegpu's own spelling must not be left in the file
    assert keys == {e2e.KARPENTER_CAPACITY_KEY, e2e.ZONE_KEY}
    for entry in raw:  # the fields Karpenter's InstanceTypeOptions decodes
        assert {"name", "architecture", "operatingSystems", "resources", "offerings"} <= entry.keys()
        assert all({"Price", "Available", "Requirements"} <= o.keys() for o in entry["offerings"])
    ours = {t.name: t for t in load_instance_types(path)}  # what `kubegpu autoscaler --instance-types` reads
    shipped = {t.name: t for t in shipped_catalogue()}
    assert ours.keys() == shipped.keys()
    for name, it in shipped.items():
        assert ours[name].capacity == it.capacity and ours[name].gpu_model == it.gpu_model
        assert sorted((o.zone, o.capacity_type, o.price) for o in ours[name].offerings) == \
            sorted((o.zone, o.capacity_type, o.price) for o in it.offerings)
    prices = e2e.price_table(entries)
    assert prices[("p4d.24xlarge", "test-zone-a", "on-demand")] == pytest.approx(32.77)
    assert len(prices) == sum(len(t.offerings) for t in shipped.values())


def _gpus(pod: dict[str, object]) -> int:
    resources = pod["spec"]["containers"][0]["resources"]  # type: ignore[index]
    return int(resources["requests"].get(e2e.GPU, 0))


@pytest.mark.parametrize(("count", "cpu_share", "mix"), [
    (500, 0.0, {1: 200, 2: 150, 4: 100, 8: 50}),
    (100, 0.2, {0: 20, 1: 32, 2: 24, 4: 16, 8: 8}),
])
def test_the_burst_has_the_issues_mix(count: int, cpu_share: float, mix: dict[int, int]) -> None:
    pods = e2e.burst(count, cpu_share)
    assert len(pods) == count and len({p["metadata"]["name"] for p in pods}) == count
    assert Counter(_gpus(p) for p in pods) == mix
    for pod in pods:
        resources = pod["spec"]["containers"][0]["resources"]
        gpus = _gpus(pod)
        if gpus:
            assert resources["limits"] == {e2e.GPU: str(gpus)}
            assert resources["requests"]["cpu"] == str(2 * gpus)
            assert resources["requests"]["memory"] == f"{8 * gpus}Gi"
        else:
            assert "limits" not in resources and {"cpu", "memory"} == resources["requests"].keys()


def test_the_table_has_a_column_and_a_ratio_per_kubegpu_variant() -> None:
    from benchmarks.karpenter import table

    def trial(system: str, variant: str, seconds: float) -> e2e.Trial:
        return e2e.Trial(system, 500, all_bound_s=seconds, first_bound_s=1.0, variant=variant)

    rows = table([trial("kubegpu", "", 60.0), trial("kubegpu", "--node-cost 6", 40.0), trial("karpenter", "", 50.0)])
    assert rows[0].split("|")[1:-1] == [
        " ", " kubegpu (defaults) 500 ", " kubegpu --node-cost 6 500 ", " Karpenter 500 ",
        " kubegpu (defaults) / Karpenter ", " kubegpu --node-cost 6 / Karpenter "]
    [timed] = [r for r in rows if r.startswith("| seconds until every pod is bound |")]
    assert timed.split("|")[2:-1] == [" 60.0 ", " 40.0 ", " 50.0 ", " 1.20× ", " 0.80× "]
    # one kubegpu variant: the table of before, three columns a size
    single = table([trial("kubegpu", "", 60.0), trial("karpenter", "", 50.0)])
    assert single[0] == "| | kubegpu 500 | Karpenter 500 | kubegpu / Karpenter |"


def test_a_system_that_did_not_run_gets_no_column() -> None:
    from benchmarks.karpenter import table

    ours = table([e2e.Trial("kubegpu", 500, all_bound_s=40.0, first_bound_s=1.0),
                  e2e.Trial("kubegpu", 2000, all_bound_s=90.0, first_bound_s=2.0)])
    assert ours[:2] == ["| | kubegpu 500 | kubegpu 2,000 |", "|---|---|---|"]
    assert "| seconds until every pod is bound | 40.0 | 90.0 |" in ours
    # Karpenter alone, every pod never bound (DRA claims): said in words, not "nan"
    theirs = table([e2e.Trial("karpenter", 500, all_bound_s=float("nan"), first_bound_s=14.0)])
    assert theirs[0] == "| | Karpenter 500 |"
    assert "| seconds until every pod is bound | – (none within the timeout) |" in theirs


def test_the_table_says_when_the_last_empty_claim_went_and_which_trials_never_got_there() -> None:
    from benchmarks.karpenter import table

    nan = float("nan")
    trials = [e2e.Trial("kubegpu", 500, all_bound_s=30.0, empty_gone_s=3.2),
              e2e.Trial("kubegpu", 500, all_bound_s=31.0, empty_gone_s=5.4),
              e2e.Trial("karpenter", 500, all_bound_s=30.0, empty_gone_s=0.4),
              e2e.Trial("karpenter", 500, all_bound_s=31.0, empty_gone_s=nan)]   # an empty claim stayed
    [row] = [r for r in table(trials) if r.startswith("| none empty after the last bind (s) |")]
    assert row.split("|")[2:-1] == [" 3–5 s ", " 0–0 s (1 of 2: not within the settle time) ", " – "]


def test_the_control_planes_counters_are_summed_by_what_the_table_shows() -> None:
    from benchmarks.karpenter_e2e import counts_by, request_key

    text = """\
# HELP scheduler_schedule_attempts_total Number of attempts to schedule pods.
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 500
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 1706
scheduler_schedule_attempts_total{profile="other",result="unschedulable"} 4
# HELP scheduler_queue_incoming_pods_total Number of pods added to scheduling queues.
# TYPE scheduler_queue_incoming_pods_total counter
scheduler_queue_incoming_pods_total{event="NodeUpdateNodeTaint",queue="active"} 600
scheduler_queue_incoming_pods_total{event="NodeUpdateNodeTaint",queue="backoff"} 59
scheduler_queue_incoming_pods_total{event="ScheduleAttemptFailure",queue="unschedulable"} 1030
# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 500
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 2380
apiserver_request_total{code="409",resource="pods",subresource="status",verb="PATCH"} 10
apiserver_request_total{code="201",resource="events",subresource="",verb="POST"} 3948
"""
    assert counts_by(text, "scheduler_schedule_attempts_total", lambda labels: labels["result"]) == {
        "scheduled": 500.0, "unschedulable": 1710.0}
    requeued = counts_by(text, "scheduler_queue_incoming_pods_total",
                         lambda labels: labels["event"] if labels["queue"] != "unschedulable" else None)
    assert requeued == {"NodeUpdateNodeTaint": 659.0}
    assert counts_by(text, "apiserver_request_total", request_key) == {
        "POST pods/binding": 500.0, "PATCH pods/status": 2390.0, "POST events": 3948.0}


def test_a_dra_share_makes_claim_pods_in_the_issues_shapes_with_their_templates_and_shared_mps_claims() -> None:
    pods = e2e.burst(40, dra_share=0.5)
    claim_pods = [p for p in pods if p["spec"].get("resourceClaims")]
    assert len(claim_pods) == 20 and not any(_gpus(p) for p in claim_pods)   # GPUs only through claims
    refs = Counter(ref.get("resourceClaimTemplateName") or "shared" for p in claim_pods
                   for ref in p["spec"]["resourceClaims"])
    assert refs == {"gpu": 8, "mig": 4, "pair": 4, "shared": 4}
    shared = Counter(ref["resourceClaimName"] for p in claim_pods for ref in p["spec"]["resourceClaims"]
                     if "resourceClaimName" in ref)
    assert list(shared.values()) == [e2e.MPS_SHARE]   # one MPS claim, used by four pods
    objects = e2e.dra_objects(pods)
    kinds = Counter(o["kind"] for o in objects)
    assert kinds["ResourceClaimTemplate"] == 3 and kinds["ResourceClaim"] == 1 and kinds["DeviceClass"] >= 3
    pair = next(o for o in objects if o["metadata"]["name"] == "pair")["spec"]["spec"]["devices"]
    assert pair["constraints"] == [{"requests": ["small", "large"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]
    assert e2e.dra_objects(e2e.burst(10)) == []   # extended-resource pods only: nothing to create
