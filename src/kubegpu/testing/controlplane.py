"""Start and stop a real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, plus kwok GPU nodes. Used by `scripts/control-plane.sh` and the pytest fixtures.

`up(DIR)` generates certificates and an admin kubeconfig into DIR, starts each component on free ports with its log in
DIR/logs/, records every process in DIR/pids *before* waiting for it (so `down` can always stop what was started, even
after a failed `up`), and returns once /readyz answers and every node is Ready. `down(DIR)` stops exactly the processes
listed in DIR/pids — each checked against the binary it was started from, so a recycled pid is never signalled.
With `real_node=True`, `up` also starts containerd and a real kubelet (Node `real-node-0`, `kubegpu.testing.realnode`),
and `down` tears that down first, leaving no process or mount behind.

Every DRA feature gate of the release is switched on (read from `kube-apiserver --help`, so a version bump picks up
new ones), and the API versions in `API_VERSIONS` are served besides the defaults.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
from kubegpu.testing import k8sbuild, realnode
from kubegpu.testing.kubeconfig import admin_cluster, write_kubeconfig
from kubegpu.testing.kwoknodes import KWOK_SELECTOR, gpu_node, is_ready, node_names
from kubegpu.testing.processes import PIDS, STOP_TIMEOUT_S, live_pids, stop_all
from kubegpu.testing.processes import is_ours as _is_ours
from kubegpu.testing.processes import read_pids as _read_pids
from kubegpu.testing.processes import signal_group as _signal

if TYPE_CHECKING:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.testing.realnode import RealNode

log = logging.getLogger("kubegpu.testing.controlplane")

HOST = "127.0.0.1"
# kube-scheduler's client-side rate limit (default 50/s): binding a few hundred DRA pods at once (claim status +
# binding + event each) should be limited by the scheduler's work, not by its throttle
SCHEDULER_QPS, SCHEDULER_BURST = 500, 1000
# kube-controller-manager's, per controller (default 20/s): its node controller lifts the `not-ready:NoSchedule` taint
# that admission puts on every new Node, a GET and a PATCH per node, so at the default a burst of new nodes becomes
# schedulable at about 5 nodes a second whatever launched them
CONTROLLER_MANAGER_QPS, CONTROLLER_MANAGER_BURST = 500, 1000
# kwok's workers per stage kind (its default 4): every kwok node's heartbeat is a status patch every 20-45 s, so with
# hundreds of nodes four workers spend their time on heartbeats and new nodes wait minutes for their first Ready,
# where each real node has a kubelet of its own
KWOK_PARALLELISM = 32
KUBECONFIG = "kubeconfig"
# API versions served besides the defaults: DRA's older and alpha versions, and the Workload/PodGroup API that the
# GenericWorkload gate (a dependency of DRAWorkloadResourceClaims) makes kube-scheduler watch — without it the
# scheduler's informers never sync and it schedules nothing.
API_VERSIONS = ("resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1alpha3",
                "scheduling.k8s.io/v1beta1")
EXTRA_GATES = ("DynamicResourceAllocation",)
READY_TIMEOUT_S = 90.0
NODES_TIMEOUT_S = 60.0
DEFAULT_GPUS = "8xA100-SXM4-80GB"


class ControlPlaneError(KubegpuError):
    """A component would not start, or the control plane directory is unusable."""


@dataclass
class ControlPlane:
    """A running control plane: its directory, admin kubeconfig, API server URL and kwok GPU nodes."""

    directory: Path
    kubeconfig: Path
    server: str
    nodes: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    feature_gates: list[str] = field(default_factory=list)
    real_node: RealNode | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def dra_feature_gates(apiserver: Path) -> list[str]:
    """Every DRA feature gate this kube-apiserver knows that can still be switched (GA-locked ones are not listed)."""
    result = subprocess.run([str(apiserver), "--help"], capture_output=True, text=True, timeout=60, check=False)
    gates = set(re.findall(r"^\s*(?:kube:)?(DRA\w+)=true\|false", result.stdout, re.MULTILINE))
    gates.update(g for g in EXTRA_GATES if re.search(rf"^\s*(?:kube:)?{g}=true\|false", result.stdout, re.MULTILINE))
    if not gates:
        raise ControlPlaneError(f"{apiserver} --help lists no DRA feature gates; is it a Kubernetes >= 1.34 build?")
    return sorted(gates)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-600:] or "(empty log)"


class _Launcher:
    """Starts components, records them in DIR/pids at once, and waits for their health endpoints."""

    def __init__(self, directory: Path, bins: Path) -> None:
        self.directory = directory
        self.bins = bins
        self.logs = directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.timings: dict[str, float] = {}
        self.ports: dict[str, int] = {}
        self._files: list[IO[bytes]] = []

    def start(self, name: str, args: list[str], binary: Path | None = None, env: dict[str, str] | None = None,
              pass_fds: tuple[int, ...] = ()) -> None:
        binary = binary or self.bins / name
        log_file = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - stays open for the child's lifetime
        self._files.append(log_file)
        process = subprocess.Popen([str(binary), *args], cwd=self.directory, stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                   pass_fds=pass_fds)
        with open(self.directory / PIDS, "a") as pids:
            pids.write(f"{process.pid} {name} {binary}\n")
        self.processes[name] = process
        self.timings[name] = time.monotonic()

    def wait_ready(self, name: str, url: str, context: ssl.SSLContext | None, timeout: float | None = None) -> None:
        timeout = READY_TIMEOUT_S if timeout is None else timeout
        process = self.processes[name]
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            code = process.poll()
            if code is not None:
                self._fail(name, f"exited with status {code}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    if response.status == 200:
                        elapsed = time.monotonic() - self.timings[name]
                        self.timings[name] = round(elapsed, 2)
                        log.info("%s ready in %.1fs", name, elapsed)
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            time.sleep(0.2)
        self._fail(name, f"not ready after {timeout:.0f}s ({url}: {last})")

    def _fail(self, name: str, why: str) -> None:
        log_path = self.logs / f"{name}.log"
        tail = _tail(log_path)
        taken = re.search(r"(?:127\.0\.0\.1|localhost|\[::\]|0\.0\.0\.0)?:(\d+): bind: address already in use", tail)
        if taken:
            raise ControlPlaneError(f"{name}: port {taken.group(1)} is taken (another process listens there); "
                                    f"log {log_path}: {tail}")
        raise ControlPlaneError(f"{name} {why}; log {log_path}: {tail}")

    def stop_started(self) -> None:
        """Terminate the children this process started itself (after a failed `up`; `down` covers other callers)."""
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                _signal(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal(process.pid, signal.SIGKILL)
                process.wait(STOP_TIMEOUT_S)

    def close(self) -> None:
        for handle in self._files:
            handle.close()


def _clean_directory(directory: Path) -> None:
    if (directory / PIDS).exists() and live_pids(directory):
        raise ControlPlaneError(f"{directory}: a control plane is already running there (see {directory / PIDS}); "
                                f"run `scripts/control-plane.sh down {directory}` first")
    (directory / PIDS).unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)


def up(directory: Path | str, nodes: int = 1, gpus: str = DEFAULT_GPUS, bins: Path | None = None,
       real_node: bool = False, node_gpus: str | None = None,
       scheduler_profiles: list[dict[str, Any]] | None = None) -> ControlPlane:
    """Start everything; on any failure stop what was started and raise ControlPlaneError naming the component.
    ``real_node``: also containerd and a real kubelet (Node `real-node-0` with ``node_gpus`` simulated GPUs).
    ``scheduler_profiles``: kube-scheduler runs with these `KubeSchedulerConfiguration` profiles instead of its
    default one (e.g. a bin-packing `NodeResourcesFit` scoring strategy)."""
    directory = Path(directory).resolve()
    if nodes < 0:
        raise ControlPlaneError(f"--nodes: must be >= 0, got {nodes}")
    bins = bins or k8sbuild.bin_dir()
    missing = k8sbuild.missing_binaries(bins)
    if missing:
        raise ControlPlaneError(f"{bins}: missing {', '.join(missing)}; run `scripts/control-plane.sh build` first")
    node_objects = [gpu_node(name, gpus) for name in node_names(nodes)]  # bad --gpus fails before anything starts
    _clean_directory(directory)
    lock_fd = None
    if real_node:
        node_gpus = node_gpus or realnode.DEFAULT_GPUS
        lock_fd = realnode.preflight(directory, node_gpus)  # no root, binaries or lock: before anything starts
    started = time.monotonic()
    launcher = _Launcher(directory, bins)
    try:
        plane = _start(directory, bins, launcher, scheduler_profiles)
        if lock_fd is not None:
            fd, lock_fd = lock_fd, None
            plane.real_node = realnode.start(launcher, fd, plane.kubeconfig, directory / "pki" / "ca.crt",
                                             plane.feature_gates, node_gpus or realnode.DEFAULT_GPUS)
        cluster = admin_cluster(plane.kubeconfig)
        for node in node_objects:
            cluster.create(node)
        plane.nodes = [node["metadata"]["name"] for node in node_objects]
        _wait_nodes_ready(cluster, plane.nodes, launcher)
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        launcher.stop_started()
        launcher.close()
        down(directory)
        raise
    launcher.close()
    plane.timings = {**launcher.timings, "total": round(time.monotonic() - started, 2)}
    log.info("control plane up in %.1fs: %s (kubeconfig %s)", plane.timings["total"], plane.server, plane.kubeconfig)
    return plane


def scheduler_config(kubeconfig: Path, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """kube-scheduler's configuration file for `profiles`: with `--config` its connection flags are ignored, so the
    kubeconfig, the rate limit (see `_start`) and leader election move into the file."""
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig), "qps": SCHEDULER_QPS, "burst": SCHEDULER_BURST},
            "leaderElection": {"leaderElect": False}, "profiles": profiles}


def _start(directory: Path, bins: Path, launcher: _Launcher,
           scheduler_profiles: list[dict[str, Any]] | None = None) -> ControlPlane:
    from kubegpu.testing import certs

    pki = certs.generate(directory / "pki")
    ports = {name: free_port() for name in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager",
                                            "kube-scheduler", "kwok")}
    launcher.ports = ports
    server = f"https://{HOST}:{ports['kube-apiserver']}"
    kubeconfig = write_kubeconfig(directory / KUBECONFIG, server, pki)
    etcd_url, peer_url = f"http://{HOST}:{ports['etcd']}", f"http://{HOST}:{ports['etcd-peer']}"
    launcher.start("etcd", [
        "--name=kubegpu", f"--data-dir={directory / 'etcd'}", f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}", f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}", f"--initial-cluster=kubegpu={peer_url}",
        "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296",
    ])
    launcher.wait_ready("etcd", f"{etcd_url}/health", None)
    apiserver_args = [
        f"--etcd-servers={etcd_url}", f"--bind-address={HOST}", f"--advertise-address={HOST}",
        f"--secure-port={ports['kube-apiserver']}", f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}", f"--client-ca-file={pki.ca_cert}",
        f"--service-account-key-file={pki.sa_public}", f"--service-account-signing-key-file={pki.sa_private}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC", "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
        "--endpoint-reconciler-type=none",  # the loopback advertise address may not back the kubernetes Service
        # pod logs, exec and port-forward through a real kubelet (its webhook authorises the admin identity)
        f"--kubelet-client-certificate={pki.admin_cert}", f"--kubelet-client-key={pki.admin_key}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",  # node names do not resolve here
        f"--runtime-config={','.join(f'{v}=true' for v in API_VERSIONS)}",
        f"--cert-dir={directory / 'pki' / 'apiserver'}", "--v=1",
    ]
    api_context = ssl.create_default_context(cafile=str(pki.ca_cert))
    api_context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    gate_names = _start_apiserver(launcher, apiserver_args, f"{server}/readyz", api_context)
    gates = ",".join(f"{gate}=true" for gate in gate_names)
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the component's own in-memory self-signed certificate; health only
    delegated = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                 f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={HOST}", "--leader-elect=false",
                 f"--feature-gates={gates}", "--v=1"]
    launcher.start("kube-controller-manager", [
        *delegated, f"--secure-port={ports['kube-controller-manager']}",
        f"--cert-dir={directory / 'pki' / 'controller-manager'}",
        f"--service-account-private-key-file={pki.sa_private}", f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
        "--use-service-account-credentials=false", "--node-monitor-grace-period=2m",
        f"--kube-api-qps={CONTROLLER_MANAGER_QPS}", f"--kube-api-burst={CONTROLLER_MANAGER_BURST}",
    ])
    scheduling = [f"--kube-api-qps={SCHEDULER_QPS}", f"--kube-api-burst={SCHEDULER_BURST}"]
    if scheduler_profiles is not None:
        config = directory / "scheduler-config.yaml"
        write_durable(config, yaml.safe_dump(scheduler_config(kubeconfig, scheduler_profiles), sort_keys=False))
        delegated = [a for a in delegated if not a.startswith(("--kubeconfig=", "--leader-elect="))]
        scheduling = [f"--config={config}"]
    launcher.start("kube-scheduler", [
        *delegated, f"--secure-port={ports['kube-scheduler']}", f"--cert-dir={directory / 'pki' / 'scheduler'}",
        *scheduling,
    ])
    kwok_config = directory / "kwok.yaml"
    write_durable(kwok_config, yaml.safe_dump({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
        "options": {"nodePlayStageParallelism": KWOK_PARALLELISM, "podPlayStageParallelism": KWOK_PARALLELISM}}))
    launcher.start("kwok", [
        f"--kubeconfig={kubeconfig}", f"--config={bins / k8sbuild.KWOK_STAGES}", f"--config={kwok_config}",
        f"--manage-nodes-with-annotation-selector={KWOK_SELECTOR}", f"--server-address={HOST}:{ports['kwok']}",
        "--cidr=10.64.0.1/12", f"--node-ip={HOST}",
    ])
    launcher.wait_ready("kube-controller-manager", f"https://{HOST}:{ports['kube-controller-manager']}/healthz",
                        insecure)
    # /readyz includes sched-handler-sync: informers synced, so the scheduler really schedules
    launcher.wait_ready("kube-scheduler", f"https://{HOST}:{ports['kube-scheduler']}/readyz", insecure)
    launcher.wait_ready("kwok", f"http://{HOST}:{ports['kwok']}/healthz", None)
    return ControlPlane(directory, kubeconfig, server, ports=ports, feature_gates=list(gate_names))


def _wait_nodes_ready(cluster: LightkubeCluster, names: list[str], launcher: _Launcher) -> None:
    if not names:
        return
    began = time.monotonic()
    deadline = began + NODES_TIMEOUT_S
    waiting = set(names)
    while time.monotonic() < deadline:
        waiting = {n for n in waiting if not is_ready(cluster.get("Node", n))}
        if not waiting:
            launcher.timings["nodes"] = round(time.monotonic() - began, 2)
            log.info("%d kwok node(s) Ready in %.1fs", len(names), launcher.timings["nodes"])
            return
        if launcher.processes["kwok"].poll() is not None:
            break
        time.sleep(0.2)
    launcher._fail("kwok", f"did not make node(s) {', '.join(sorted(waiting))} Ready in {NODES_TIMEOUT_S:.0f}s")


_DEPENDS = re.compile(r"depends on features that are disabled: \[([^\]]*)\]")


def _start_apiserver(launcher: _Launcher, args: list[str], readyz: str, context: ssl.SSLContext) -> list[str]:
    """Start kube-apiserver with every DRA gate on; return the gates used.

    A gate may depend on others (in 1.37 DRAWorkloadResourceClaims needs GenericWorkload); the API server names the
    missing ones and exits, so they are added and it is started again. The resolved set is cached next to the
    binaries, so only the first `up` after a build pays for the retries.
    """
    cache = launcher.bins / k8sbuild.GATES_CACHE
    try:
        gates = cache.read_text().split()
    except OSError:
        gates = dra_feature_gates(launcher.bins / "kube-apiserver")
    for _attempt in range(6):
        launcher.start("kube-apiserver", [*args, f"--feature-gates={','.join(f'{g}=true' for g in gates)}"])
        try:
            launcher.wait_ready("kube-apiserver", readyz, context)
        except ControlPlaneError:
            missing = _DEPENDS.findall(_tail(launcher.logs / "kube-apiserver.log", 20))
            extra = sorted({g for found in missing for g in found.replace(",", " ").split()} - set(gates))
            if not extra:
                raise
            log.info("kube-apiserver: enabling %s (required by the DRA gates)", ", ".join(extra))
            gates = sorted({*gates, *extra})
            continue
        cache.write_text("\n".join(gates) + "\n")
        return gates
    raise ControlPlaneError(f"kube-apiserver: feature gate dependencies did not resolve; log {launcher.logs}")


# ---------------------------------------------------------------------------------------------------------- down


def down(directory: Path | str) -> list[str]:
    """Stop the processes DIR/pids lists, last started first (clients before the API server, etcd last, so none
    hangs on a server already gone): SIGTERM, then SIGKILL after STOP_TIMEOUT_S. Returns the names stopped."""
    directory = Path(directory).resolve()
    node_stopped = realnode.teardown(directory, _read_pids(directory))  # before the API server the kubelet needs
    entries = [(pid, name, binary) for pid, name, binary in _read_pids(directory) if _is_ours(pid, binary)]
    clients = [entry for entry in entries if entry[1] not in ("kube-apiserver", "etcd")]
    for stage in (clients, [e for e in entries if e[1] == "kube-apiserver"], [e for e in entries if e[1] == "etcd"]):
        stop_all(stage, STOP_TIMEOUT_S)
    (directory / PIDS).unlink(missing_ok=True)
    _remove_tree(directory / "etcd")
    return node_stopped + [name for _, name, _ in entries]


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """`build | up DIR [--nodes N] [--gpus COUNTxMODEL] | down DIR`; errors are one `error:` line, exit 1."""
    import argparse

    parser = argparse.ArgumentParser(prog="control-plane.sh", description="A real Kubernetes control plane on "
                                     "127.0.0.1 for kubegpu's tests (see docs/testing.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build (or reuse) the binaries; prints their directory")
    build_cmd.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    build_cmd.add_argument("--no-real-node", dest="real_node", action="store_false",
                           help="only the control plane, not the real node's kubelet, containerd, runc and images")
    up_cmd = commands.add_parser("up", help="start everything in DIR; returns once the API server and nodes are ready")
    up_cmd.add_argument("directory", metavar="DIR", type=Path)
    up_cmd.add_argument("--nodes", type=int, default=None, help="kwok GPU nodes to create (default 1; 0 with "
                        "--real-node)")
    up_cmd.add_argument("--gpus", default=None, help=f"GPUs per node, COUNTxMODEL (default {DEFAULT_GPUS}; "
                        "2xA100-SXM4-80GB for the real node)")
    up_cmd.add_argument("--real-node", action="store_true", help="also start containerd and a real kubelet "
                        "(Node real-node-0, simulated GPUs in DIR/real-node-0.json; needs root)")
    down_cmd = commands.add_parser("down", help="stop the processes DIR/pids lists")
    down_cmd.add_argument("directory", metavar="DIR", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request drowns the timings
    try:
        if args.command == "build":
            print(k8sbuild.build(force=args.force))
            if args.real_node:
                from kubegpu.testing import nodebuild

                print(nodebuild.build(force=args.force))
        elif args.command == "up":
            nodes = args.nodes if args.nodes is not None else (0 if args.real_node else 1)
            plane = up(args.directory, nodes=nodes, gpus=args.gpus or DEFAULT_GPUS, real_node=args.real_node,
                       node_gpus=args.gpus)
            print(f"export KUBECONFIG={plane.kubeconfig}")
            if plane.real_node is not None:
                node = plane.real_node
                print(f"# real node {node.name}: --gpu-backend {node.gpu_backend}; DRA --kubelet-plugins-dir "
                      f"{node.paths.plugins_dir} --kubelet-registrar-dir {node.paths.registry_dir}; images "
                      f"{node.test_image} and {node.pause_image} (also in {node.paths.images_file})")
        else:
            stopped = down(args.directory)
            log.info("stopped %s", ", ".join(stopped) or "nothing (no live process in DIR/pids)")
    except KubegpuError as exc:
        print(f"error: {exc}", flush=True, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
