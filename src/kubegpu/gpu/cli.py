"""`kubegpu sim-node`: make, poke and inspect simulated GPU nodes (the files `--gpu-backend sim:PATH` reads)."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kubegpu.cliopts import FORMATS, OptionError, emit, legacy_alias, output_file_option, output_option
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.simulated import SimulatedBackend, State

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # a DNS subdomain, as the API server wants a Node name

sim_node = typer.Typer(
    help="Simulated GPU nodes: a JSON file that node-side commands use with --gpu-backend sim:PATH.",
    no_args_is_help=True,
)


@sim_node.command("create")
def create(
    gpus: str = typer.Option(..., "--gpus", help="GPUs as COUNTxMODEL[,COUNTxMODEL...], e.g. 8xA100-SXM4-80GB or "
                             f"4xH100-SXM5-80GB,4xL4. Models: {', '.join(CATALOG)}."),
    out: Path = output_file_option(help="Node file to write (replaced if it exists).", required=True),
    node_name: str = typer.Option("sim-node", "--node-name", help="Node name; GPU UUIDs derive from it."),
) -> None:
    """Create a simulated node: MIG disabled on every GPU, idle, no events."""
    if len(node_name) > 253 or not _NODE_NAME.match(node_name):
        raise OptionError(f"--node-name {node_name!r}: must be a Kubernetes node name (lowercase letters, digits, "
                          "'-' and '.', starting and ending with a letter or digit)")
    backend = SimulatedBackend.create(out, gpus=gpus, node_name=node_name)
    devices = backend.devices()
    models = [d.model_key or d.product_name for d in devices]
    typer.echo(f"created {out}: node {node_name} with {len(devices)} GPUs ({_summary(models)})")


def _summary(models: list[str]) -> str:
    counts: dict[str, int] = {}
    for model in models:
        counts[model] = counts.get(model, 0) + 1
    return ", ".join(f"{count}x{model}" for model, count in counts.items())


@sim_node.command("inject-xid")
def inject_xid(
    node_file: Path = typer.Argument(..., help="Simulated node file."),
    gpu: int = typer.Option(..., "--gpu", help="GPU index."),
    xid: int = typer.Option(..., "--xid", min=1, help="XID error number, e.g. 79 (fallen off the bus), 48 (DBE)."),
    gi: int | None = typer.Option(None, "--gi", help="Attribute the error to this GPU instance (MIG)."),
) -> None:
    """Raise an XID event on one GPU, as the driver would report it."""
    event = SimulatedBackend(node_file).inject_xid(gpu, xid, gi_id=gi)
    where = f" (GPU instance {gi})" if gi is not None else ""
    typer.echo(f"XID {event.xid} raised on GPU {event.gpu_index}{where} at {event.timestamp:.3f}")


@sim_node.command("set-load")
def set_load(
    node_file: Path = typer.Argument(..., help="Simulated node file."),
    gpu: int = typer.Option(..., "--gpu", help="GPU index."),
    util: float = typer.Option(..., "--util", min=0.0, max=100.0, help="GPU utilization, percent."),
    memory: int = typer.Option(0, "--memory-mib", min=0, help="Memory in use, MiB."),
    gi: int | None = typer.Option(None, "--gi", help="Set the load of this GPU instance (MIG) instead."),
) -> None:
    """Set what a GPU (or one MIG device) is doing; power, temperature and clocks follow from it."""
    backend = SimulatedBackend(node_file)
    backend.set_load(gpu, util, memory, gi_id=gi)
    reading = backend.sample(gpu, gi)
    typer.echo(f"GPU {gpu}{f' GI {gi}' if gi is not None else ''}: {reading.gpu_util:.0f}% busy, "
               f"{reading.memory_used_mib} MiB used, {reading.power_w:.0f} W")


@sim_node.command("add-process")
def add_process(
    node_file: Path = typer.Argument(..., help="Simulated node file."),
    gpu: int = typer.Option(..., "--gpu", help="GPU index."),
    pid: int = typer.Option(..., "--pid", help="Process id (the same pid again replaces its entry)."),
    memory: int = typer.Option(..., "--memory-mib", help="GPU memory the process holds, MiB."),
    gi: int | None = typer.Option(None, "--gi", help="GPU instance it runs in (required when MIG is enabled)."),
    name: str = typer.Option("python", "--name", help="Process name, as nvidia-smi would show it."),
) -> None:
    """Start a compute process on a GPU or MIG device: the instance is then "in use", so `mig-parted apply` will
    not destroy it and the GPU cannot be reset; its memory counts as used in samples (and so in the exporter)."""
    backend = SimulatedBackend(node_file)
    backend.add_process(gpu, pid, memory, gi_id=gi, name=name)
    where = f"GPU {gpu}" + (f" GI {gi}" if gi is not None else "")
    typer.echo(f"process {pid} ({name}) runs on {where} holding {memory} MiB")


@sim_node.command("remove-process")
def remove_process(
    node_file: Path = typer.Argument(..., help="Simulated node file."),
    gpu: int = typer.Option(..., "--gpu", help="GPU index."),
    pid: int = typer.Option(..., "--pid", help="Process id given to add-process."),
) -> None:
    """End a process started with add-process, freeing its GPU or MIG device."""
    SimulatedBackend(node_file).remove_process(gpu, pid)
    typer.echo(f"process {pid} on GPU {gpu} ended")


@sim_node.command("set-process-memory")
def set_process_memory(
    node_file: Path = typer.Argument(..., help="Simulated node file."),
    pid: int = typer.Option(..., "--pid", help="Process id given to add-process."),
    memory: int = typer.Option(..., "--memory-mib", min=0, help="GPU memory the process holds now, MiB."),
) -> None:
    """Grow (or shrink) a process's GPU memory, as a leak would: past the GPU's free memory it is refused, as the
    driver refuses the allocation."""
    gpu = SimulatedBackend(node_file).set_process_memory(pid, memory)
    typer.echo(f"process {pid} on GPU {gpu} now holds {memory} MiB")


@sim_node.command("reboot")
def reboot(node_file: Path = typer.Argument(..., help="Simulated node file.")) -> None:
    """Reboot the node: pending MIG modes take effect, MIG devices and processes are gone, and the boot ID changes
    (a DRA driver started afterwards forgets the claims it had prepared; the kubelet prepares them again)."""
    backend = SimulatedBackend(node_file)
    backend.reboot()
    typer.echo(f"node {backend.node_name} rebooted (boot {backend.boot_id()})")


@sim_node.command("show")
def show(node_file: Path = typer.Argument(..., help="Simulated node file."),
         output: str = output_option("table", FORMATS)) -> None:
    """Print the node: GPUs with their load, MIG devices with their placements, recent XID events."""
    backend = SimulatedBackend(node_file)
    state = backend.snapshot()
    if output != "table":
        emit(state, output)
        return
    console = Console(width=200)
    console.print(f"node [bold]{state['node_name']}[/bold] · driver {state['driver_version']} · CUDA "
                  f"{'.'.join(map(str, state['cuda_driver_version']))} · {node_file}")
    console.print(_gpu_table(backend))
    mig_table = _mig_table(backend)
    if mig_table.row_count:
        console.print(mig_table)
    process_table = _process_table(backend)
    if process_table.row_count:
        console.print(process_table)
    if state["xid_events"]:
        console.print(_xid_table(state))


def _mig_mode(device_enabled: bool, pending: bool, capable: bool) -> str:
    if not capable:
        return "n/a"
    mode = "on" if device_enabled else "off"
    return f"{mode} (reset pending)" if pending else mode


def _gpu_table(backend: SimulatedBackend) -> Table:
    table = Table(title="GPUs")
    for column in ("#", "model", "uuid", "pci bus", "numa", "dev", "MIG", "util %", "memory MiB", "temp °C",
                   "power W", "processes"):
        table.add_column(column)
    for device in backend.devices():
        reading = backend.sample(device.index)
        table.add_row(
            str(device.index), device.model_key or device.product_name, device.uuid, device.pci_bus_id,
            str(device.numa_node), f"/dev/nvidia{device.device_minor}",
            _mig_mode(device.mig_enabled, device.mig_pending, device.mig_capable),
            f"{reading.gpu_util:.0f}", f"{reading.memory_used_mib}/{device.memory_mib}",
            f"{reading.temperature_c:.0f}", f"{reading.power_w:.0f}",
            str(len(backend.processes(device.index))),
        )
    return table


def _mig_table(backend: SimulatedBackend) -> Table:
    table = Table(title="MIG devices")
    for column in ("gpu", "gi", "ci", "profile", "placement", "memory MiB", "SMs", "uuid"):
        table.add_column(column)
    for device in backend.devices():
        for mig in backend.mig_devices(device.index):
            table.add_row(str(mig.gpu_index), str(mig.gi_id), str(mig.ci_id), mig.profile_name,
                          f"{mig.start}:{mig.size}", str(mig.memory_mib), str(mig.multiprocessors), mig.uuid)
    return table


def _process_table(backend: SimulatedBackend) -> Table:
    table = Table(title="Processes")
    for column in ("gpu", "gi", "pid", "name", "memory MiB"):
        table.add_column(column)
    for device in backend.devices():
        for process in backend.processes(device.index):
            table.add_row(str(process.gpu_index), "-" if process.gi_id is None else str(process.gi_id),
                          str(process.pid), process.name, str(process.used_memory_mib))
    return table


def _xid_table(state: State, last: int = 10) -> Table:
    table = Table(title=f"XID events (last {last})")
    for column in ("gpu", "xid", "gi", "timestamp"):
        table.add_column(column)
    for event in state["xid_events"][-last:]:
        gi = event.get("gi_id")
        table.add_row(str(event["gpu_index"]), str(event["xid"]), "-" if gi is None else str(gi),
                      f"{event['timestamp']:.3f}")
    return table


def register(app: typer.Typer) -> None:
    app.add_typer(sim_node, name="sim-node")
    legacy_alias("sim-node create", "--out", "--output-file")
