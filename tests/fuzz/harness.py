"""What the fuzz tests and `benchmarks/fuzz.py` feed every file-taking entry point, and how an outcome is judged.

An input kind is a file kind kubegpu reads (a device-plugin config, a scenario, a partitioner state file, the `sim:`
node file, ...): a file suffix, one or more valid seed documents, and a loader that runs the same validation the
command does. `mutate` turns a seed into a hostile file (wrong types, huge or non-finite numbers, deep nesting,
alias bombs, truncation, bad bytes). `judge` runs a loader and classifies the outcome: `accepted`, `clean` (one
KubegpuError line naming the file) or `traceback` (anything else: the defects the fuzzers look for).
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubegpu.autoscaler.cli import load_manifests, load_nodepools
from kubegpu.autoscaler.instancetypes import default_instance_types, load_instance_types, to_kwok
from kubegpu.config import load_yaml_file
from kubegpu.config.deviceplugin import parse_device_plugin_config
from kubegpu.config.migparted import check_layouts, parse_mig_parted_config
from kubegpu.discovery.labels import checked_features_file, format_features_file, parse_features_file
from kubegpu.errors import KubegpuError
from kubegpu.exporter.counters import default_counters_text, load_counters
from kubegpu.files import read_text
from kubegpu.gpu.simulated import SimulatedBackend, new_node_state, parse_gpu_spec
from kubegpu.partitioner.snapshot import load_state, planner_inputs
from kubegpu.sharing.mps import (
    GpuLimits,
    MpsPlan,
    dumps_limits,
    dumps_slices,
    limits_document,
    parse_limits,
    read_slices,
)
from kubegpu.sim.scenario import load_scenario
from kubegpu.sim.workload import load_trace
from kubegpu.statefiles import dumps_stamped

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _sim_node(path: Path) -> object:
    backend = SimulatedBackend(path)
    for device in backend.devices():
        backend.sample(device.index)
        backend.mig_devices(device.index) if device.mig_enabled else None
    return backend.xid_events(0.0)


def _state(path: Path) -> object:
    return planner_inputs(load_state(path), str(path))


def _mig_parted(path: Path) -> object:
    return check_layouts(parse_mig_parted_config(load_yaml_file(path), str(path)))


def _device_plugin(path: Path) -> object:
    return parse_device_plugin_config(load_yaml_file(path), str(path))


def _pods(path: Path) -> object:
    from kubegpu.autoscaler.cli import _check_pods

    pods = load_manifests(path, "Pod")
    _check_pods(pods, path)
    return pods


def _nfd_labels(path: Path) -> object:
    return parse_features_file(read_text(path), str(path))


def _mps_limits(path: Path) -> object:
    return parse_limits(read_text(path), str(path))


def _labels() -> dict[str, str]:
    return {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/mig.capable": "true", "nvidia.com/gpu.replicas": "1"}


def _mps_plans() -> list[MpsPlan]:
    return [MpsPlan("nvidia.com/gpu", "/run/nvidia/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/log",
                    (GpuLimits(0, "GPU-0", 3, 27306, 33), GpuLimits(1, "GPU-1", 3, 27306, 33)))]


@dataclass(frozen=True)
class InputKind:
    name: str
    suffix: str
    seeds: tuple[str, ...]  # file texts
    load: Callable[[Path], object]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _pod_seed() -> str:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                              "limits": {"nvidia.com/gpu": 1}}}]}}
    return yaml.safe_dump_all([pod, {**pod, "metadata": {"name": "q"}}])


def input_kinds() -> list[InputKind]:
    node = new_node_state(parse_gpu_spec("2xA100-SXM4-80GB"), "n1")
    node["gpus"][0]["mig_enabled"] = True
    return [
        InputKind("device-plugin-config", ".yaml",
                  tuple(_text(p) for p in sorted(EXAMPLES.glob("device-plugin-*.yaml"))), _device_plugin),
        InputKind("mig-parted-config", ".yaml", (_text(EXAMPLES / "mig-parted.yaml"),), _mig_parted),
        InputKind("scenario", ".yaml", (_text(EXAMPLES / "scenario-small.yaml"),), load_scenario),
        InputKind("trace", ".yaml",
                  (_text(ROOT / "src/kubegpu/sim/scenarios/trace-example-jobs.yaml"),), load_trace),
        InputKind("partitioner-state", ".yaml", (_text(EXAMPLES / "plan-state.yaml"),), _state),
        InputKind("nodepools", ".yaml", (_text(EXAMPLES / "nodepool-gpu.yaml"),), load_nodepools),
        InputKind("pods", ".yaml", (_pod_seed(),), _pods),
        InputKind("instance-types", ".json", (json.dumps(to_kwok(default_instance_types()[:3])),),
                  load_instance_types),
        # as kubegpu writes it (checksummed) and as a person writes it (no checksum: mutations reach every field)
        InputKind("sim-node", ".json", (dumps_stamped(node), json.dumps(node)), _sim_node),
        InputKind("counters", ".csv", (default_counters_text(),), load_counters),
        InputKind("mps-slices", ".json", ('{"0": [20, 20, 40], "1": [10]}', dumps_slices({0: [20, 20, 40]})),
                  read_slices),
        InputKind("nfd-labels", "", (checked_features_file(_labels()), format_features_file(_labels())),
                  _nfd_labels),
        InputKind("mps-limits", ".json", (dumps_limits(_mps_plans()), json.dumps(limits_document(_mps_plans()))),
                  _mps_limits),
    ]


# ---------------------------------------------------------------------------------------------- mutations

HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, -(2**63), 10**30, 10**400, 1e308, -1e308, 2.5, "", "x", "1e400", "-1e400",
    "9" * 5000, ".inf", "nan", "100000000", "all", "1Gi", "-5Gi", "10000000000000Ei", [], {}, [1, "x"], {"k": None},
    "\u202e\u0000", "a" * 10000, 100_000_000, "1e-400", "0x10",
]


def _hostile(rng: random.Random) -> Any:
    """One HOSTILE value, copied: later edits of the same case (a list extended in place) must not change the
    module's list, or case N would depend on the cases a worker ran before it and could not be replayed alone."""
    return copy.deepcopy(rng.choice(HOSTILE))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    if len(prefix) > 40:  # a planted deep structure: deeper paths add nothing
        return found
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _deep(rng: random.Random) -> Any:
    value: Any = rng.choice([1, "x", None])
    for _ in range(rng.choice([70, 150, 300])):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=64)
def _parsed_seed(seed: str, suffix: str) -> Any:
    """A seed parsed once per process (libyaml when there): re-parsing a 7 KiB YAML seed in pure Python for every
    case was four fifths of the fuzzer's time. Callers mutate a deep copy."""
    return json.loads(seed) if suffix == ".json" else list(yaml.load_all(seed, Loader=_FAST_LOADER))


def _structural(rng: random.Random, seed: str, suffix: str) -> str:
    try:
        doc = copy.deepcopy(_parsed_seed(seed, suffix))
    except (ValueError, yaml.YAMLError):
        return seed
    for _ in range(rng.randint(1, 3)):
        paths = _paths(doc)
        if not paths:
            doc = _hostile(rng)
            continue
        path = rng.choice(paths)
        roll = rng.random()
        if roll < 0.55:
            doc = _set(doc, path, _hostile(rng))
        elif roll < 0.7:
            doc = _set(doc, path, None, delete=True)
        elif roll < 0.8:
            doc = _set(doc, path, _deep(rng))
        elif roll < 0.9:
            doc = _set(doc, (*path[:-1], rng.choice(["unknown", "Replicas", "x" * 300, 7])), _hostile(rng)) \
                if len(path) > 0 and isinstance(_container(doc, path), dict) else doc
        else:
            target = _container(doc, path)
            if isinstance(target, list) and target:
                target.extend([target[0]] * rng.choice([1, 20, 100]))
    try:
        if suffix == ".json":
            return json.dumps(doc)  # may write Infinity/NaN for float inf: exactly what hostile files contain
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        if isinstance(doc, list) and rng.random() < 0.5:
            return yaml.dump_all(doc, Dumper=dumper)
        return yaml.dump(doc, Dumper=dumper)
    except (RecursionError, ValueError):
        return "[" * 3000


def _container(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


def _textual(rng: random.Random, seed: str) -> bytes:
    data = bytearray(seed.encode("utf-8"))
    roll = rng.random()
    if roll < 0.25 and data:
        return bytes(data[: rng.randrange(len(data))])  # a torn write
    if roll < 0.45 and data:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if roll < 0.55:
        return rng.randbytes(rng.randint(0, 400))
    if roll < 0.65:
        return BOMB.encode()
    if roll < 0.72:
        return ("[" * rng.choice([100, 999, 5000]) + "]" * 3).encode()
    if roll < 0.8:
        return b"a: &x [1, *x]\n" if rng.random() < 0.5 else b"!!python/object/apply:os.system ['true']\n"
    if roll < 0.9 and data:
        at = rng.randrange(len(data))
        return bytes(data[:at] + rng.choice([b"\x00", b"\n  - ", b": :", b"{{{", b"&a *a", b"\t", b"\xef\xbb\xbf"])
                     + data[at:])
    return b""


def mutate(rng: random.Random, kind: InputKind) -> bytes:
    """A hostile file derived from one of the kind's seeds (structural edits 60 %, byte-level 40 %)."""
    seed = rng.choice(kind.seeds)
    if rng.random() < 0.6:
        return _structural(rng, seed, kind.suffix).encode("utf-8", "surrogatepass")
    return _textual(rng, seed)


# ---------------------------------------------------------------------------------------------- judging


@dataclass
class Outcome:
    verdict: str  # "accepted" | "clean" | "traceback"
    detail: str = ""


def judge(kind: InputKind, path: Path) -> Outcome:
    """Run the loader once: accepted, a clean one-line error naming the file, or a traceback (with its type)."""
    try:
        kind.load(path)
    except KubegpuError as exc:
        message = exc.message
        if "\n" in message or not message:
            return Outcome("traceback", f"multi-line error: {message[:200]!r}")
        return Outcome("clean", message)
    except Exception as exc:
        return Outcome("traceback", f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return Outcome("accepted")
