"""`kubegpu operator`: the ClusterPolicy controller, plus two offline commands that show exactly what it would do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from kubegpu.cliopts import (
    duration_option,
    emit,
    legacy_alias,
    metrics_address_option,
    output_dir_option,
    output_option,
)
from kubegpu.errors import ConfigError

operator_app = typer.Typer(
    help="The operator: one ClusterPolicy installs, orders, validates and upgrades the whole GPU stack. "
    "Without a sub-command it runs the controller (kopf, standalone, with leader election).",
    invoke_without_command=True,
)


def load_policy(path: Path) -> tuple[Any, list[str]]:
    """Our ClusterPolicy from FILE (ours, or NVIDIA's `nvidia.com/v1`, mapped) and the mapping's notes."""
    from kubegpu.files import load_yaml_file
    from kubegpu.operator.nvidia import from_nvidia
    from kubegpu.operator.policy import parse_policy

    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a ClusterPolicy must be a mapping")
    notes: list[str] = []
    if data.get("apiVersion") == "nvidia.com/v1":
        data, notes = from_nvidia(data)
    elif data.get("apiVersion") not in (None, "kubegpu.io/v1"):
        raise ConfigError(f"{path}: apiVersion: want kubegpu.io/v1 or nvidia.com/v1, got {data.get('apiVersion')!r}")
    if data.get("kind", "ClusterPolicy") != "ClusterPolicy":
        raise ConfigError(f"{path}: kind: want ClusterPolicy, got {data.get('kind')!r}")
    return parse_policy(data, str(path)), notes


@operator_app.command("render", help="Print every object the operator would apply (multi-document YAML, in order).")
def render_command(
    policy_file: Path = typer.Option(..., "--policy", help="ClusterPolicy YAML (kubegpu.io/v1 or nvidia.com/v1)."),
    out_dir: Path | None = output_dir_option(help="Write one file per object to this directory."),
    namespace: str = typer.Option("kubegpu", "--namespace", "-n", help="Namespace of the operands."),
) -> None:
    from kubegpu.files import write_durable
    from kubegpu.operator.render import file_name, render, to_yaml

    policy, notes = load_policy(policy_file)
    for note in notes:
        typer.echo(f"warning: {note}", err=True)
    objects = [obj for _, objs in render(policy, namespace) for obj in objs]
    if out_dir is None:
        typer.echo(to_yaml(objects), nl=False)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, obj in enumerate(objects):
        write_durable(out_dir / file_name(index, obj), to_yaml([obj]))
    typer.echo(f"wrote {len(objects)} objects to {out_dir}", err=True)


@operator_app.command("convert", help="Print a GPU Operator (nvidia.com/v1) ClusterPolicy as ours (kubegpu.io/v1).")
def convert_command(
    policy_file: Path = typer.Option(..., "--policy", help="ClusterPolicy YAML (nvidia.com/v1 or kubegpu.io/v1)."),
) -> None:
    import yaml

    policy, notes = load_policy(policy_file)
    for note in notes:
        typer.echo(f"warning: {note}", err=True)
    data = policy.model_dump(mode="json", exclude_defaults=True)
    data = {"apiVersion": policy.apiVersion, "kind": policy.kind, "metadata": {"name": policy.name},
            "spec": data.get("spec", {})}
    typer.echo(yaml.safe_dump(data, sort_keys=False, width=120), nl=False)


@operator_app.command("node-labels", help="Print the node labels the operator would set or remove, per Node.")
def node_labels_command(
    policy_file: Path = typer.Option(..., "--policy", help="ClusterPolicy YAML."),
    nodes_file: Path = typer.Option(..., "--nodes", help="Nodes: a YAML list or a kind: List."),
    output: str = output_option("json"),
) -> None:
    from kubegpu.files import load_yaml_file
    from kubegpu.operator.nodelabels import nodes_from, plan_labels

    policy, notes = load_policy(policy_file)
    for note in notes:
        typer.echo(f"warning: {note}", err=True)
    nodes = nodes_from(load_yaml_file(nodes_file), str(nodes_file))
    plan = plan_labels(policy, nodes)
    emit({name: plan[name].as_json() for name in sorted(plan)}, output)


@operator_app.command("crds", help="Print (or write) the CRDs the project defines, as the operator applies them.")
def crds_command(out_dir: Path | None = output_dir_option(help="Write one file per CRD to this directory.")) -> None:
    from kubegpu.operator.crds import all_crds, write_all

    if out_dir is None:
        from kubegpu.operator.render import to_yaml

        typer.echo(to_yaml(all_crds()), nl=False)
    else:
        for path in write_all(out_dir):
            typer.echo(str(path), err=True)


@operator_app.command("cleanup", help="What `helm uninstall` runs first: delete the ClusterPolicies, wait for the "
                                         "operands to stop, and take the stack's labels off every Node.")
def cleanup_command(
    namespace: str = typer.Option("kubegpu", "--namespace", "-n", envvar="POD_NAMESPACE",
                                  help="Namespace of the operands."),
    timeout: float = duration_option(120.0, "--timeout", help="How long to wait for the operands to stop."),
) -> None:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.operator.uninstall import cleanup

    result = cleanup(LightkubeCluster(), namespace, timeout)
    typer.echo(f"cleanup: deleted ClusterPolicy {', '.join(result.policies) or '(none)'}; operands stopped in "
               f"{result.waited_s:.0f}s; cleaned {len(result.nodes)} node(s)", err=True)
    for node, keys in sorted(result.nodes.items()):
        typer.echo(f"  {node}: removed {', '.join(keys)}", err=True)


@operator_app.callback()
def run_command(
    ctx: typer.Context,
    namespace: str = typer.Option("kubegpu", "--namespace", "-n", envvar="POD_NAMESPACE",
                                  help="Namespace of the operands and of the leader Lease."),
    skip_crds: bool = typer.Option(False, "--skip-crds", help="Do not server-side apply our CRDs at start."),
    crds_dir: Path | None = typer.Option(None, "--crds-dir",
                                         help="Directory of CRD YAML to apply at start besides ours."),
    metrics_address: str = metrics_address_option(":8080"),
) -> None:
    """Run the ClusterPolicy controller (kopf, standalone, with leader election)."""
    if ctx.invoked_subcommand is not None:
        return
    from kubegpu.operator.controller import run

    run(namespace=namespace, apply_crds_at_start=not skip_crds, crds_dir=crds_dir,
        metrics_address=metrics_address or None)


def _looks_like_policy(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == "ClusterPolicy" and \
        data.get("apiVersion") in ("kubegpu.io/v1", "nvidia.com/v1")


def _validate_policy(data: object, source: str, _options: object) -> str:
    from kubegpu.operator.nvidia import from_nvidia
    from kubegpu.operator.policy import parse_policy

    assert isinstance(data, dict)
    notes: list[str] = []
    if data.get("apiVersion") == "nvidia.com/v1":
        data, notes = from_nvidia(data)
    policy = parse_policy(data, source)
    enabled = [name for name, block in policy.spec if getattr(block, "enabled", False)]
    return f"{len(enabled)} components enabled" + (f", {len(notes)} NVIDIA fields not honoured" if notes else "")


def register(app: typer.Typer) -> None:
    from kubegpu.config import register_validator

    app.add_typer(operator_app, name="operator")
    for command in ("operator render", "operator crds"):
        legacy_alias(command, "-o", "--output-dir")
    register_validator("ClusterPolicy", _looks_like_policy, _validate_policy)
