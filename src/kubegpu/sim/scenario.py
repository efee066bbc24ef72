"""Scenario files: the cluster, the workload, the strategies to compare, how long and with which seed.

Pydantic models with camelCase field names as written in YAML. `load_scenario` turns any problem into ONE line
naming the file and the field path (``scenario.yaml: cluster.nodeGroups[1].gpuModel: unknown GPU model 'X'``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kubegpu.config import field_path
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import load_yaml_file, parse_yaml_text
from kubegpu.sim.units import parse_duration

Seconds = Annotated[float, BeforeValidator(parse_duration)]


def _range(value: object) -> tuple[float, float]:
    """A number, or [low, high] drawn uniformly."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (_bounded(value), _bounded(value))
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
        low, high = _bounded(value[0]), _bounded(value[1])
        if low > high:
            raise ValueError(f"range [{value[0]}, {value[1]}] has low > high")
        return (low, high)
    raise ValueError(f"expected a number or [low, high], got {value!r}")


MAX_RANGE_VALUE = 1e6  # GiB, fractions of a GPU: any real value is far smaller


def _bounded(value: float) -> float:
    if not abs(value) <= MAX_RANGE_VALUE:  # NaN and inf too
        raise ValueError(f"numbers must be at most {MAX_RANGE_VALUE:.0e} in magnitude, got {str(value)[:40]}")
    return float(value)


Range = Annotated[tuple[float, float], BeforeValidator(_range)]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              allow_inf_nan=False)


class NodeGroup(_Model):
    name: str = Field(min_length=1)
    count: int = Field(ge=0, le=100_000)
    gpu_model: str
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    price_per_hour: float = Field(ge=0, le=1e6)
    cpu: float = Field(default=96, gt=0, le=1e5)
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

        try:
            parse_quantity(value)
        except ConfigError as exc:  # a ValueError lets pydantic name the field path and the file
            raise ValueError(str(exc)) from None
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
    priority: int = Field(default=0, ge=-(2**31), lt=2**31)  # Kubernetes priorities are int32
    arrivals_per_hour: float = Field(gt=0, le=1e6)
    diurnal_amplitude: float = Field(default=0.0, ge=0, le=1)
    peak_hour: float = Field(default=14.0, ge=0, lt=24)
    gpus: list[int] = Field(default=[1], min_length=1)
    memory_gib: Range = Field(alias="memoryGiB")
    compute: Range
    runtime: tuple[Seconds, Seconds]
    max_retries: int = Field(default=2, ge=0, le=1000)
    memory_growth_gib_per_hour: Range | None = Field(default=None, alias="memoryGrowthGiBPerHour")  # creeping use
    memory_growth_share: float = Field(default=1.0, ge=0, le=1, alias="memoryGrowthShare")  # of its jobs that creep

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_choices(cls, value: object) -> object:
        return [value] if isinstance(value, int) else value

    @field_validator("memory_growth_gib_per_hour")
    @classmethod
    def _growth(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and value[0] < 0:
            raise ValueError("memory growth cannot be negative")
        return value

    @field_validator("gpus")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(count < 1 or count > 64 for count in value):
            raise ValueError("every GPU count must be between 1 and 64")
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


class NodeBringUp(_Model):
    """From launch to usable GPUs, stage by stage, as the operator brings a node up: the instance boots and joins,
    then the validator's chain runs in the GPU Operator's order — driver, container toolkit, a CUDA workload, the
    device plugin — each stage waiting on the previous one's barrier file. The node's GPUs are schedulable only once
    the last one (`plugin-ready`) passes. Defaults are assumptions that add up to the 5 minutes the simulator always
    used for a GPU node (a precompiled driver; a driver compiled at boot takes minutes longer)."""

    boot: Seconds = 90.0
    driver: Seconds = 120.0
    toolkit: Seconds = 30.0
    cuda: Seconds = 30.0
    plugin: Seconds = 30.0

    @field_validator("boot", "driver", "toolkit", "cuda", "plugin")
    @classmethod
    def _not_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError("must not be negative")
        return value

    @property
    def total(self) -> float:
        """Seconds from a node's launch to its GPUs being allocatable."""
        return self.boot + self.driver + self.toolkit + self.cuda + self.plugin


MAX_SPOT_RATE = 1.0  # per node-hour: one interruption an hour on average is already far past any real spot market
MAX_SPOT_NOTICE_S = 3600.0


class SpotInterruptions(_Model):
    """Spot interruptions of the nodes controllers buy at run time (`sim.add_node`); the scenario's own nodes are
    on-demand. Each bought node's lifetime to its interruption is drawn from an exponential distribution with this
    rate, from an RNG seeded by the scenario seed and the node's name, so a seed replays the same interruptions.
    After `notice` (AWS gives two minutes) the node is gone: its pods are evicted and requeued, its cost stops."""

    per_node_hour: float = Field(ge=0, le=MAX_SPOT_RATE)
    notice: Seconds = 120.0

    @field_validator("notice")
    @classmethod
    def _short_notice(cls, value: float) -> float:
        if value > MAX_SPOT_NOTICE_S:
            raise ValueError(f"must be at most {MAX_SPOT_NOTICE_S:.0f}s")
        return value


class TeamSpec(_Model):
    """A team: its namespace, its elastic quota (`min` guaranteed, `max` the most it may use; GPU memory as
    `kubegpu.io/gpu-memory` quantities, e.g. `320Gi`) and its share of the workload's jobs."""

    name: str
    min: str = "0"
    max: str | None = None
    share: float

    @field_validator("min", "max")
    @classmethod
    def _amount(cls, value: str | None) -> str | None:
        if value is not None:
            from kubegpu.scheduling.quantity import parse_quantity

            try:
                if parse_quantity(value) < 0:
                    raise ValueError("must not be negative")
            except KubegpuError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("share")
    @classmethod
    def _share(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError("must be in (0, 1]")
        return value


class Scenario(_Model):
    name: str = "scenario"
    cluster: ClusterSpec
    workload: WorkloadSpec
    strategies: list[str] = Field(default=["exclusive", "time-slicing:4", "static-mig:all-balanced"], min_length=1)
    optional_strategies: list[str] = Field(default_factory=list)  # run only when a plug-in has registered them
    duration: Seconds = 86400.0
    seed: int = 1
    sample_interval: Seconds = 300.0
    node_bring_up: NodeBringUp = Field(default_factory=NodeBringUp)
    spot_interruptions: SpotInterruptions | None = None
    teams: list[TeamSpec] = Field(default_factory=list)
    source_dir: str = Field(default=".", exclude=True)

    @field_validator("duration", "sample_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be longer than zero")
        return value

    @field_validator("teams")
    @classmethod
    def _teams(cls, value: list[TeamSpec]) -> list[TeamSpec]:
        names = [team.name for team in value]
        if len(set(names)) != len(names):
            raise ValueError(f"team names must be unique: {names}")
        if value and sum(team.share for team in value) > 1 + 1e-9:
            raise ValueError("the teams' shares add up to more than 1")
        return value


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
    data = load_yaml_file(file)  # bounded, UTF-8, safe YAML: every problem is one ConfigError line
    return parse_scenario(data, file.name, str(file.parent))


def default_scenario() -> Scenario:
    """The scenario shipped with the package (what `kubegpu simulate` runs with no arguments)."""
    text = resources.files("kubegpu.sim").joinpath("scenarios/default.yaml").read_text()
    return parse_scenario(parse_yaml_text(text, "default.yaml"), "default.yaml")
