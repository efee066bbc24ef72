"""Scenario files: the cluster, the workload, the strategies to compare, how long and with which seed.

Pydantic models with camelCase field names as written in YAML. `load_scenario` turns any problem into ONE line
naming the file and the field path (``scenario.yaml: cluster.nodeGroups[1].gpuModel: unknown GPU model 'X'``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kubegpu.errors import ConfigError
from kubegpu.sim.units import parse_duration

Seconds = Annotated[float, BeforeValidator(parse_duration)]


def _range(value: object) -> tuple[float, float]:
    """A number, or [low, high] drawn uniformly."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value), float(value))
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
        low, high = float(value[0]), float(value[1])
        if low > high:
            raise ValueError(f"range [{value[0]}, {value[1]}] has low > high")
        return (low, high)
    raise ValueError(f"expected a number or [low, high], got {value!r}")


Range = Annotated[tuple[float, float], BeforeValidator(_range)]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class NodeGroup(_Model):
    name: str = Field(min_length=1)
    count: int = Field(ge=0)
    gpu_model: str
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    price_per_hour: float = Field(ge=0)
    cpu: float = Field(default=96, gt=0)
    memory: str = "1024Gi"

    @field_validator("gpu_model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        from kubegpu.errors import NotFoundError
        from kubegpu.gpu.catalog import get_model

        try:
            return get_model(value).key
        except NotFoundError:
            raise ValueError(f"unknown GPU model {value!r}") from None

    @field_validator("memory")
    @classmethod
    def _quantity(cls, value: str) -> str:
        from kubegpu.scheduling import parse_quantity

        parse_quantity(value)
        return value


class ClusterSpec(_Model):
    node_groups: list[NodeGroup] = Field(min_length=1)
    scoring: str = Field(default="least-allocated", pattern="^(least-allocated|most-allocated)$")

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSpec:
        names = [group.name for group in self.node_groups]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"nodeGroups[{index}].name: duplicate node group name {name!r}")
        return self


class JobClass(_Model):
    """One kind of work: Poisson arrivals (optionally with a day/night swing) and the ranges its pods draw from."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    priority: int = 0
    arrivals_per_hour: float = Field(gt=0)
    diurnal_amplitude: float = Field(default=0.0, ge=0, le=1)
    peak_hour: float = Field(default=14.0, ge=0, lt=24)
    gpus: list[int] = Field(default=[1], min_length=1)
    memory_gib: Range = Field(alias="memoryGiB")
    compute: Range
    runtime: tuple[Seconds, Seconds]
    max_retries: int = Field(default=2, ge=0)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_choices(cls, value: object) -> object:
        return [value] if isinstance(value, int) else value

    @field_validator("gpus")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(count < 1 for count in value):
            raise ValueError("every GPU count must be at least 1")
        return value

    @field_validator("runtime", mode="before")
    @classmethod
    def _runtime_range(cls, value: object) -> object:
        return [value, value] if not isinstance(value, list | tuple) else value

    @field_validator("compute")
    @classmethod
    def _fraction(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] <= 0 or value[1] > 1:
            raise ValueError("compute need is a fraction of a full GPU in (0, 1]")
        return value

    @field_validator("runtime")
    @classmethod
    def _ordered_runtime(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] > value[1] or value[0] <= 0:
            raise ValueError("expected a positive duration or [low, high] with low <= high")
        return value


class WorkloadSpec(_Model):
    classes: list[JobClass] | None = None
    trace: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        if (self.classes is None) == (self.trace is None):
            raise ValueError("give exactly one of 'classes' (a generator) or 'trace' (a file)")
        return self


class Scenario(_Model):
    name: str = "scenario"
    cluster: ClusterSpec
    workload: WorkloadSpec
    strategies: list[str] = Field(default=["exclusive", "time-slicing:4", "static-mig:all-balanced"], min_length=1)
    optional_strategies: list[str] = Field(default_factory=list)  # run only when a plug-in has registered them
    duration: Seconds = 86400.0
    seed: int = 1
    sample_interval: Seconds = 300.0
    source_dir: str = Field(default=".", exclude=True)

    @field_validator("duration", "sample_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be longer than zero")
        return value


def field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a field path: ('cluster', 'nodeGroups', 1, 'gpuModel') →
    cluster.nodeGroups[1].gpuModel"""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not str(part).startswith("function-"):
            path += f".{part}" if path else str(part)
    return path


def first_error(exc: ValidationError, source: str) -> ConfigError:
    error = exc.errors()[0]
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    path = field_path(tuple(error["loc"]))
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif error["type"] == "missing":
        message = "required field is missing"
    return ConfigError(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def parse_scenario(data: Any, source: str, source_dir: str = ".") -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with cluster, workload, strategies, ...")
    try:
        return Scenario.model_validate({**data, "sourceDir": source_dir})
    except ValidationError as exc:
        raise first_error(exc, source) from None


def load_scenario(path: str | Path) -> Scenario:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read scenario: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{file}: not valid YAML{where}") from None
    return parse_scenario(data, file.name, str(file.parent))


def default_scenario() -> Scenario:
    """The scenario shipped with the package (what `kubegpu simulate` runs with no arguments)."""
    text = resources.files("kubegpu.sim").joinpath("scenarios/default.yaml").read_text()
    return parse_scenario(yaml.safe_load(text), "default.yaml")
