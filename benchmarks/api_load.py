"""Requests per minute each cluster-side controller sends the real API server — the autoscaler, the partitioner, the
quota controller and the operator — idle (and, at full size, the autoscaler and the partitioner busy), from the code
before it read through informers and from this tree, in one run; read from the API server's own /metrics
(`apiserver_request_total`, by verb).

    python benchmarks/api_load.py [--quick] [--window 30] [--before REF]

Starts one control plane (binaries from `scripts/control-plane.sh build`), installs our CRDs, one GPU NodePool and
one ClusterPolicy, then runs each command as its own process — `kubegpu autoscaler --interval 1` (kwok provider),
`kubegpu partitioner --interval 1`, `kubegpu quota controller --interval 2` and `kubegpu operator` — once from the
code before and once from this tree. "Before" is, per controller, the parent of the commit that moved it onto
informers (found in git history: the commit that added `kubegpu/kube/informer.py` for the autoscaler and the
partitioner, the first to use it in `quota/controller.py` and `operator/controller.py` for the other two); its `src/`
is exported into a temp directory with `git archive` and put first on PYTHONPATH. Exporting old commits, rather than
keeping a "relist" mode in the controllers, keeps the product free of a mode nobody should run, and measures the
code as it really was. `--before REF` uses one ref for all four instead.

Each command is measured over `--window` seconds after a warm-up in which it does its initial sync:
- idle: no pods at all (the operator with one ClusterPolicy and no GPU node);
- busy (not with `--quick`): a pending GPU pod created every half second (the autoscaler launches kwok nodes for
  them, kube-scheduler binds them; the partitioner sees pending MIG pods).
Printed per scenario: requests/min by verb net of the control plane's own traffic (a window with no command
running, same length, subtracted), LIST before and after, and the after/before ratio of all requests. The goal: no
LIST after the initial sync from any idle controller — 0 in the `LIST after` column for all four.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.autoscaler.builders: the shared builders

from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound
from kubegpu.testing import controlplane, k8sbuild
from kubegpu.testing.kubeconfig import admin_client
from kubegpu.testing.session import RealCluster, install_crds
from tests.autoscaler.builders import nodepool, pod

ROOT = Path(__file__).resolve().parents[1]
POOL = "api-load"
VERBS = ("LIST", "WATCH", "GET", "POST", "PATCH", "PUT", "DELETE")
_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$')


def request_totals(client: Any) -> dict[str, float]:
    """apiserver_request_total summed by verb, from the API server's /metrics (as the admin)."""
    response = client._client._client.get("/metrics")  # lightkube's httpx client: base URL and credentials set
    response.raise_for_status()
    totals: dict[str, float] = {}
    for line in response.text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        verb = re.search(r'verb="([A-Z]+)"', match.group("labels"))
        if verb is not None:
            totals[verb.group(1)] = totals.get(verb.group(1), 0.0) + float(match.group("value"))
    return totals


def export_tree(ref: str, into: Path) -> Path:
    """`src/` as of `ref`, written under `into`; returns the directory to put on PYTHONPATH."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


@dataclass(frozen=True)
class Controller:
    """One controller's command (`{lease}`: a fresh namespace per run for its Lease, `{id}`: its identity) and how
    to find the code before it read through informers: the first commit that added `text` to `path` (None: that
    added the file), whose parent is "before"."""

    name: str
    command: tuple[str, ...]
    path: str
    text: str | None = None
    busy: dict[str, int] | None = None   # the extended resource the busy scenario's pending pods ask for


CONTROLLERS = (
    Controller("autoscaler", ("autoscaler", "--interval", "1", "--metrics-address", "", "--registration-delay", "1",
                              "--lease-namespace", "{lease}", "--identity", "{id}"),
               "src/kubegpu/kube/informer.py", busy={"nvidia.com/gpu": 1}),
    Controller("partitioner", ("partitioner", "--interval", "1", "--batch-window-idle", "1",
                               "--batch-window-timeout", "5", "--lease-namespace", "{lease}", "--identity", "{id}"),
               "src/kubegpu/kube/informer.py", busy={"nvidia.com/mig-1g.10gb": 1}),
    Controller("quota", ("quota", "controller", "--interval", "2", "--namespace", "{lease}"),
               "src/kubegpu/quota/controller.py", "InformedCluster"),
    Controller("operator", ("operator", "--namespace", "{lease}", "--metrics-address", ""),
               "src/kubegpu/operator/controller.py", "def inform("),
)


def default_before(controller: Controller) -> str:
    """The parent of the oldest commit that added `controller.text` to its path (or the path itself)."""
    select = ["--diff-filter=A"] if controller.text is None else ["-S", controller.text]
    out = subprocess.run(["git", "-C", str(ROOT), "log", *select, "--format=%H", "--", controller.path],
                         check=True, capture_output=True, text=True).stdout.split()
    if not out:
        raise KubegpuError(f"cannot find the commit that moved the {controller.name} onto informers; pass --before")
    return f"{out[-1]}^"


class Load:
    """Pending GPU pods, one every `every` seconds, until stopped (the busy scenarios)."""

    def __init__(self, cluster: Any, namespace: str, every: float, limits: dict[str, int]) -> None:
        self.cluster, self.namespace, self.every, self.limits = cluster, namespace, every, limits
        self.stop = threading.Event()
        self.created = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.created += 1
            with contextlib.suppress(KubegpuError):
                self.cluster.create(pod(f"load-{time.monotonic_ns()}", cpu="100m", memory="128Mi",
                                        namespace=self.namespace, limits=self.limits,
                                        spec={"nodeSelector": {"api-load": POOL}}))

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()


def clean(real: RealCluster, namespace: str) -> None:
    """Remove what a busy run left: its pods, NodeClaims and the nodes launched for them (finalizers included)."""
    admin = real.admin
    for item in admin.list("Pod", namespace):
        with contextlib.suppress(NotFound):
            admin.delete("Pod", item["metadata"]["name"], namespace)
    for kind in ("NodeClaim", "Node"):
        for item in admin.list(kind):
            if (item["metadata"].get("labels") or {}).get("kubegpu.io/nodepool") != POOL:
                continue
            with contextlib.suppress(NotFound):
                admin.patch(kind, item["metadata"]["name"], {"metadata": {"finalizers": None}})
                admin.delete(kind, item["metadata"]["name"])


def measure(real: RealCluster, command: list[str] | None, env: dict[str, str], warmup: float, window: float,
            busy: Callable[[], Load] | None, log: Path) -> dict[str, float]:
    """Requests per minute by verb during `window` seconds (after `warmup`), with `command` running."""
    client = admin_client(real.kubeconfig)
    proc = None
    if command is not None:
        with log.open("w") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        time.sleep(warmup)
        if proc is not None and proc.poll() is not None:
            raise KubegpuError(f"{' '.join(command or [])} exited {proc.returncode}: {log.read_text()[-400:]}")
        with busy() if busy is not None else contextlib.nullcontext():
            before, began = request_totals(client), time.monotonic()
            time.sleep(window)
            after, ended = request_totals(client), time.monotonic()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    minutes = (ended - began) / 60.0
    return {verb: (after.get(verb, 0.0) - before.get(verb, 0.0)) / minutes for verb in VERBS}


def net(rates: dict[str, float], baseline: dict[str, float]) -> dict[str, float]:
    return {verb: max(0.0, rates[verb] - baseline.get(verb, 0.0)) for verb in VERBS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per scenario")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds for start-up and the initial sync")
    parser.add_argument("--before", default=None, help="one git ref of the code before informers, for all four")
    parser.add_argument("--quick", action="store_true", help="10 s windows, idle scenarios only")
    args = parser.parse_args(argv)
    window = 10.0 if args.quick else args.window
    missing = k8sbuild.missing_binaries()
    if missing:
        print(f"error: {k8sbuild.bin_dir()}: missing {', '.join(missing)}; run scripts/control-plane.sh build",
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="kubegpu-api-load-") as tmp:
        base = Path(tmp)
        try:
            before = {c.name: args.before or default_before(c) for c in CONTROLLERS}
            trees: dict[str, Path] = {}
            for ref in dict.fromkeys(before.values()):
                trees[ref] = export_tree(ref, base / f"before-{len(trees)}")
        except (KubegpuError, subprocess.CalledProcessError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for name, ref in before.items():
            short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True,
                                   text=True).stdout.strip()
            print(f"{name:12s} before: {ref} ({short}); after: this tree")
        began = time.monotonic()
        try:
            plane = controlplane.up(base / "plane", nodes=0)
            print(f"control plane up in {time.monotonic() - began:.1f}s")
            rows = run(RealCluster(plane), {name: trees[ref] for name, ref in before.items()}, base, args.warmup,
                       window, busy=not args.quick)
        except KubegpuError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            controlplane.down(base / "plane")
    report(rows, window)
    return 0


def run(real: RealCluster, old_src: dict[str, Path], base: Path, warmup: float, window: float,
        busy: bool = True) -> list[tuple[str, Any, Any]]:
    install_crds(real, sorted((ROOT / "deploy" / "crds").glob("*.yaml")))
    namespace = real.create_namespace("api-load")
    real.admin.create(nodepool(POOL, labels={"api-load": POOL}))
    real.admin.create({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "api-load"},
                       "spec": {"gfd": {"enabled": False}}})
    env = {**os.environ, **real.env()}
    here = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])}
    baseline = measure(real, None, env, 0.0, window, None, base / "baseline.log")
    print(f"control plane alone: {sum(baseline.values()):.0f} requests/min")
    rows: list[tuple[str, Any, Any]] = []
    for controller in CONTROLLERS:
        there = {**env, "PYTHONPATH": os.pathsep.join([str(old_src[controller.name]), env.get("PYTHONPATH", "")])}
        for loaded in (False, True) if busy and controller.busy else (False,):
            scenario = f"{controller.name} {'busy' if loaded else 'idle'}"
            results = []
            for label, pyenv in (("before", there), ("after", here)):
                lease = real.create_namespace(f"lease-{controller.name}")  # a fresh Lease: no wait for the last
                identity = f"{label}-{controller.name}"
                command = [sys.executable, "-m", "kubegpu",
                           *(part.format(lease=lease, id=identity) for part in controller.command)]
                load = (lambda c=controller: Load(real.admin, namespace, 0.5, c.busy or {})) if loaded else None
                rates = measure(real, command, {**pyenv, "POD_NAME": identity}, warmup, window, load,
                                base / f"{label}-{scenario}.log")
                results.append(net(rates, baseline))
                clean(real, namespace)
                print(f"  {scenario:18s} {label:6s} " + " ".join(f"{v}={results[-1][v]:.0f}" for v in VERBS))
            rows.append((scenario, results[0], results[1]))
    return rows


def report(rows: list[tuple[str, Any, Any]], window: float) -> None:
    print(f"\nrequests/min to the API server, net of the control plane's own ({window:.0f} s windows)")
    print(f"{'scenario':18s} {'LIST before':>11s} {'LIST after':>10s} {'all before':>10s} {'all after':>9s} "
          f"{'after/before':>12s}")
    for scenario, before, after in rows:
        total_b, total_a = sum(before.values()), sum(after.values())
        ratio = f"{total_a / total_b:.3f}" if total_b else "-"
        print(f"{scenario:18s} {before['LIST']:11.0f} {after['LIST']:10.0f} {total_b:10.0f} {total_a:9.0f} "
              f"{ratio:>12s}")
    idle = [(scenario, after["LIST"]) for scenario, _, after in rows if scenario.endswith(" idle")]
    listing = [scenario.split()[0] for scenario, lists in idle if lists >= 0.5]
    print(f"\nidle controllers still sending LIST: {', '.join(listing) if listing else 'none'} "
          f"(goal: none of {len(idle)})")


if __name__ == "__main__":
    raise SystemExit(main())
