"""`kubegpu dra allocate | slices` (offline tools) and `kubegpu dra-driver` (the node's DRA kubelet plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from kubegpu.cliopts import cdi_root_option, choice_option, duration_option, emit, output_option
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import DRIVER, gpu_offers, read_node
from kubegpu.dra.server import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR
from kubegpu.dra.slices import build_slices
from kubegpu.files import parse_yaml_documents, read_text
from kubegpu.gpu.backend import open_backend
from kubegpu.gpu.options import gpu_backend_option
from kubegpu.scheduling.dra import allocate_in_order, flatten, parse_all

LAYOUTS = ("split", "combined")
FRACTIONAL_HELP = ("Share whole GPUs by thousandths (consumable capacity `compute`, 1000 per GPU); each share runs "
                   "under MPS with its active-thread percentage and memory limit in proportion.")
dra_app = typer.Typer(help="Dynamic Resource Allocation: allocate claims offline, show a node's ResourceSlices.",
                      no_args_is_help=True)


def _objects(path: Path) -> list[Any]:
    return flatten(parse_yaml_documents(read_text(path), str(path)), str(path))


@dra_app.command("allocate")
def allocate_command(
    slices: Path = typer.Option(..., "--slices", help="ResourceSlices: YAML/JSON documents or a `kind: List`."),
    claims: Path = typer.Option(..., "--claims", help="ResourceClaims, allocated in file order."),
    classes: Path | None = typer.Option(None, "--classes", help="DeviceClasses (default: the shipped ones)."),
    output: str = output_option("json"),
) -> None:
    """Allocate claims as kube-scheduler would, each against what earlier claims took."""
    parsed_slices = parse_all(_objects(slices), "ResourceSlice", str(slices))
    class_objects = _objects(classes) if classes is not None else shipped_class_objects()
    parsed_classes = parse_all(class_objects, "DeviceClass", str(classes or "shipped DeviceClasses"))
    parsed_claims = parse_all(_objects(claims), "ResourceClaim", str(claims))
    outcomes = allocate_in_order(parsed_slices, {c.name: c for c in parsed_classes}, parsed_claims)
    answer = {key: outcome.to_json() for key, outcome in outcomes.items()}
    emit(answer, output)


@dra_app.command("slices")
def slices_command(
    gpu_backend: str = gpu_backend_option(),
    node_name: str = typer.Option(..., "--node-name", envvar="NODE_NAME", help="The node (and pool) name."),
    dynamic_mig: bool = typer.Option(False, "--dynamic-mig", help="Offer every MIG placement (partitionable)."),
    fractional: bool = typer.Option(False, "--fractional", help=FRACTIONAL_HELP),
    driver_name: str = typer.Option(DRIVER, "--driver-name", help="DRA driver name."),
    layout: str = choice_option("split", LAYOUTS, "--layout", help="Counter layout: split (1.35+) or combined (1.34)."),
    output: str = output_option("yaml", help="Output format: yaml (multi-document) | json."),
) -> None:
    """Print the ResourceSlices the DRA driver would publish for this node."""
    backend = open_backend(gpu_backend)
    try:
        node = read_node(backend)
    finally:
        backend.close()
    objects = build_slices(node_name, gpu_offers(node, dynamic_mig, fractional), driver=driver_name, layout=layout)
    emit(objects, output, documents=True)


def dra_driver_command(
    gpu_backend: str = gpu_backend_option(),
    node_name: str = typer.Option(..., "--node-name", envvar="NODE_NAME", help="This node's name (the pool name)."),
    driver_name: str = typer.Option(DRIVER, "--driver-name", envvar="DRIVER_NAME",
                                    help="DRA driver name (NVIDIA's, so claims written for it work unchanged)."),
    dynamic_mig: bool = typer.Option(False, "--dynamic-mig", envvar="DYNAMIC_MIG",
                                     help="Offer every MIG placement; create it at prepare, destroy at unprepare."),
    fractional: bool = typer.Option(False, "--fractional", envvar="FRACTIONAL", help=FRACTIONAL_HELP),
    plugins_dir: Path = typer.Option(Path(DEFAULT_PLUGINS_DIR), "--kubelet-plugins-dir",
                                     envvar="KUBELET_PLUGINS_DIRECTORY_PATH",
                                     help="The kubelet's plugins directory (the DRA socket goes in <dir>/<driver>)."),
    registry_dir: Path = typer.Option(Path(DEFAULT_REGISTRY_DIR), "--kubelet-registrar-dir",
                                      envvar="KUBELET_REGISTRAR_DIRECTORY_PATH",
                                      help="The kubelet's plugin-registration directory."),
    cdi_root: Path = cdi_root_option(envvar="CDI_ROOT", help="Directory where claim CDI specs are written."),
    mps_root: str = typer.Option("/run/nvidia/mps", "--mps-root", envvar="MPS_ROOT",
                                 help="Where MPS-shared claims' daemon pipe and log directories live."),
    layout: str = choice_option("split", LAYOUTS, "--slice-layout",
                                help="Counter layout: split (1.35+) or combined (1.34)."),
    interval: float = duration_option(5.0, "--health-interval", positive=True,
                                      help="Time between health checks and publications."),
    publish: bool = typer.Option(True, "--publish/--no-publish", help="Publish ResourceSlices to the API server."),
) -> None:
    """The DRA kubelet plugin: ResourceSlices, NodePrepareResources/NodeUnprepareResources, CDI, dynamic MIG."""
    import asyncio
    import logging
    import signal

    from kubegpu.dra.agent import DraAgent
    from kubegpu.dra.driver import DraDriver
    from kubegpu.dra.publish import SlicePublisher
    from kubegpu.dra.server import DraPluginServer
    from kubegpu.kube.errors import NotFound
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.sharing.mps_control import find_mps_control

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = LightkubeCluster()

    def get_claim(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return cluster.get("ResourceClaim", name, namespace)
        except NotFound:
            return None

    backend = open_backend(gpu_backend)
    plugin_dir = plugins_dir / driver_name
    # MPS-shared claims get a daemon each where the binary exists; a simulated node only records their limits
    mps_binary = None if gpu_backend.startswith("sim:") else find_mps_control()
    driver = DraDriver(backend, node_name, plugin_dir, cdi_root, get_claim, driver_name, dynamic_mig, mps_root,
                       mps_binary, fractional=fractional)
    server = DraPluginServer(driver, plugin_dir, registry_dir)
    agent = DraAgent(driver, server, SlicePublisher(cluster, node_name, driver_name) if publish else None,
                     layout=layout)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop, interval)

    try:
        asyncio.run(main())
    finally:
        backend.close()


def _dra_kind(kind: str) -> Any:
    def detect(data: object) -> bool:
        return isinstance(data, dict) and data.get("kind") == kind and str(data.get("apiVersion", "")).startswith(
            "resource.k8s.io/")

    def validate(data: object, source: str, _options: object) -> str:
        parsed = parse_all([data], kind, source)[0]  # type: ignore[list-item]
        if kind == "ResourceSlice":
            return f"pool {parsed.pool}, {len(parsed.devices)} devices, {len(parsed.shared_counters)} counter sets"
        if kind == "DeviceClass":
            return f"{len(parsed.selectors)} selectors (CEL compiles)"
        return f"{len(parsed.requests)} requests, {len(parsed.constraints)} constraints (CEL compiles)"

    return detect, validate


def register_validators() -> None:
    """Let `kubegpu validate-config` check DRA objects (CEL compiled, fields as the allocator reads them)."""
    from kubegpu.config import register_validator

    for kind in ("ResourceClaim", "ResourceSlice", "DeviceClass"):
        register_validator(kind, *_dra_kind(kind))


def register(app: typer.Typer) -> None:
    app.add_typer(dra_app, name="dra")
    register_validators()
    app.command("dra-driver")(dra_driver_command)
