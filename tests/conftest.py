"""Fixtures shared across components' tests (keep this small)."""

from __future__ import annotations

import atexit
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubegpu.testing.nodepods import NodeSession
    from kubegpu.testing.session import RealCluster
    from tests.fakes.apiserver import ApiServer


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    """An emulated Kubernetes API server (kmock + compat) over HTTP, started once per session.

    ``apiserver.cluster()`` gives a LightkubeCluster pointed at it; see tests/fakes/apiserver.py for its limits.
    """
    from tests.fakes.apiserver import start_apiserver  # kmock and lightkube load only for tests that use it

    server = start_apiserver()
    yield server
    server.stop()


# ---------------------------------------------------------------- the real control plane (docs/testing.md)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: pytest then runs fixture teardown (and atexit hooks run), so no control plane outlives it."""
    raise KeyboardInterrupt(f"signal {signum}")


def _control_plane_unavailable(reason: str) -> None:
    """Skip locally; in CI (CI=true) `.ci/run` built the binaries, so their absence fails the run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"real control plane unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"real control plane unavailable: {reason}")


@pytest.fixture(scope="session")
def k8s_binaries() -> Path:
    """The directory of the real control plane's binaries; skips (fails when CI=true) when they are not built."""
    from kubegpu.errors import KubegpuError
    from kubegpu.testing import k8sbuild

    try:
        missing = k8sbuild.missing_binaries()
    except KubegpuError as exc:
        _control_plane_unavailable(str(exc))
    if missing:
        _control_plane_unavailable(f"{k8sbuild.bin_dir()}: missing {', '.join(missing)} "
                                   "(run `scripts/control-plane.sh build`)")
    return k8sbuild.bin_dir()


@pytest.fixture(scope="session")
def real_cluster(k8s_binaries: Path, request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """A real kube-apiserver + etcd + kube-controller-manager + kube-scheduler + kwok on 127.0.0.1, one per session,
    with one kwok GPU node (8xA100-SXM4-80GB). ``real_cluster.cluster()`` gives a LightkubeCluster (admin);
    ``real_cluster.kubeconfig`` the admin kubeconfig. Tests using it are marked ``apiserver`` automatically.

    Its directory (component logs in ``logs/``) is removed afterwards unless a test failed; it is not under pytest's
    basetemp, which a concurrent pytest run on the same machine may prune."""
    import shutil
    import tempfile

    from kubegpu.testing import controlplane
    from kubegpu.testing.session import RealCluster

    directory = Path(tempfile.mkdtemp(prefix="kubegpu-control-plane-"))
    atexit.register(controlplane.down, directory)  # even if pytest is interrupted before fixture teardown
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # `timeout`, CI cancellation: tear down too
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        plane = controlplane.up(directory, nodes=1, bins=k8s_binaries)
        yield RealCluster(plane)
    finally:
        controlplane.down(directory)
        if request.session.testsfailed:
            print(f"\nreal control plane logs kept in {directory / 'logs'}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def namespace(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the real control plane for one test (its default ServiceAccount exists), deleted after."""
    name = real_cluster.create_namespace(request.node.name)
    yield name
    real_cluster.delete_namespace(name)


# ---------------------------------------------------------------- the real node (docs/testing.md, node tier)


@pytest.fixture(scope="session")
def real_node(k8s_binaries: Path, request: pytest.FixtureRequest) -> Iterator[NodeSession]:
    """A control plane of its own plus containerd and a real kubelet (Node `real-node-0`, 2 simulated A100s in
    ``real_node.node.node_file``), one per test session; tests using it are marked ``kubelet``. Needs root and the
    node binaries (`scripts/control-plane.sh build`): without them it skips locally and fails with CI=true. Its own
    control plane (no kwok node) keeps the real node away from other tests' pods and slices."""
    import shutil
    import tempfile

    from kubegpu.testing import controlplane, realnode
    from kubegpu.testing.nodepods import NodeSession
    from kubegpu.testing.session import RealCluster

    reason = realnode.unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real node unavailable in CI: {reason}", pytrace=False)
        pytest.skip(f"real node unavailable: {reason}")
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-real-node-"))
    atexit.register(controlplane.down, directory)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        plane = controlplane.up(directory, nodes=0, bins=k8s_binaries, real_node=True,
                                node_gpus=realnode.DEFAULT_GPUS)
        yield NodeSession(RealCluster(plane), plane.real_node, directory / "logs")
    finally:
        controlplane.down(directory)
        left = realnode.leftovers(directory)
        if left:  # `down` must leave no process or mount behind
            pytest.fail(f"real node left behind: {'; '.join(left)}", pytrace=False)
        if request.session.testsfailed:
            print(f"\nreal node logs kept in {directory / 'logs'}")
            _print_device_manager_lines(directory / "logs" / "kubelet.log")
        else:
            shutil.rmtree(directory, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the real control plane carries the `apiserver` marker (select with -m apiserver), and
    every test on the real node the `kubelet` marker (-m kubelet)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if {"real_cluster", "k8s_binaries"} & fixtures:
            item.add_marker(pytest.mark.apiserver)
        if "real_node" in fixtures:
            item.add_marker(pytest.mark.kubelet)


def _print_device_manager_lines(kubelet_log: Path, count: int = 40) -> None:
    """The kubelet's last device-plugin lines: where a CI run's node-tier failure starts (its logs stay there)."""
    if not kubelet_log.exists():
        return
    lines = [line for line in kubelet_log.read_text(errors="replace").splitlines()
             if "plugin" in line.lower() or "devicemanager" in line.lower()]
    print("\n".join([f"kubelet device-plugin lines (last {count}):", *lines[-count:]]))
