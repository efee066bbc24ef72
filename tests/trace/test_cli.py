"""`kubegpu trace replay` and `kubegpu trace report` end to end on the vendored sample of the trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from kubegpu.cli import app

DATA = Path(__file__).parent / "data"
NODES = str(DATA / "openb_node_list_gpu_node.csv.gz")
PODS = str(DATA / "openb_pod_list_gpuspec33_sample.csv.gz")


def _replay(*extra: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["trace", "replay", "--format", "openb", "--nodes", NODES, "--pods", PODS,
                                      *extra])
    return result.exit_code, result.stdout, result.stderr


def test_replay_prints_the_issue_json_shape() -> None:
    code, out, _ = _replay("--policy", "kubegpu", "--seed", "42", "--inflation", "0.05", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["policy", "seed", "totalGpus", "allocatedPercent", "skippedPods", "wallSeconds"]
    assert data["policy"] == "kubegpu" and data["seed"] == 42 and data["totalGpus"] == 6212
    curve = data["allocatedPercent"]
    assert len(curve) == 131 and curve[0] == 0.0
    assert curve == sorted(curve)  # tasks never leave: allocation only grows
    assert 0 < curve[5] <= 5.0 + 1e-9  # the sample reaches 5 % of capacity and nothing is skipped that early
    assert isinstance(data["skippedPods"], int) and data["wallSeconds"] >= 0


def test_replay_in_a_fresh_process_prints_nothing_but_the_json() -> None:
    # the kubegpu policy prices shares with a HiGHS LP, and HiGHS prints a banner on file descriptor 1 when a
    # process builds its first solver: only a real process shows it (CliRunner captures Python's stdout, not the fd)
    done = subprocess.run([sys.executable, "-m", "kubegpu", "trace", "replay", "--format", "openb", "--nodes", NODES,
                           "--pods", PODS, "--policy", "kubegpu", "--inflation", "0.02", "-o", "json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["policy"] == "kubegpu"


def test_every_policy_runs_and_seeds_reproduce() -> None:
    for policy in ("kube-default", "random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"):
        code, out, err = _replay("--policy", policy, "--seed", "1", "--inflation", "0.02")
        assert code == 0, err
        assert json.loads(out)["policy"] == policy
    first = json.loads(_replay("--policy", "random", "--seed", "3", "--inflation", "0.02")[1])
    again = json.loads(_replay("--policy", "random", "--seed", "3", "--inflation", "0.02")[1])
    assert first["allocatedPercent"] == again["allocatedPercent"]


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    code, _, err = _replay("--policy", "nope")
    assert code == 2 and "--policy" in err and "kubegpu" in err and len(err.strip().splitlines()) == 1
    code, _, err = _replay("--inflation", "0")
    assert code == 2 and "--inflation" in err
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,abc\n")
    result = CliRunner().invoke(app, ["trace", "replay", "--nodes", NODES, "--pods", str(bad)])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {bad}:2: column gpu_milli: 'abc' is not an integer"


def test_html_page_and_report_of_several_policies(tmp_path: Path) -> None:
    page = tmp_path / "one.html"
    code, _, _ = _replay("--policy", "fgd", "--inflation", "0.03", "--html", str(page))
    assert code == 0 and "data:image/png;base64," in page.read_text()
    results = []
    for policy in ("fgd", "kubegpu"):
        path = tmp_path / f"{policy}.json"
        path.write_text(_replay("--policy", policy, "--inflation", "0.03")[1])
        results.append(str(path))
    report = tmp_path / "report.html"
    done = CliRunner().invoke(app, ["trace", "report", *results, "--html", str(report), "--title", "sample"])
    assert done.exit_code == 0, done.stderr
    text = report.read_text()
    assert "<th>fgd</th>" in text and "<th>kubegpu</th>" in text and "data:image/png;base64," in text
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"policy": "x"}))
    done = CliRunner().invoke(app, ["trace", "report", str(broken), "--html", str(report)])
    assert done.exit_code == 1 and "not a `kubegpu trace replay -o json` result" in done.stderr
