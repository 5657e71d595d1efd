"""Search-space files: which knob values to try, what to skip, the budget, tolerances, timing.

Spaces are YAML (or JSON) files validated by a frozen pydantic model. `candidates()` expands one
into the concrete Settings to measure on a device, dropping (with a reason) what cannot apply there.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from advisor import impls as conv_impls
from advisor.device import environment
from advisor.errors import SpaceError, check_file, first_line, validation_message
from advisor.knobs import KNOB_NAMES, KNOBS, Settings, amp_why_not, compile_why_not
from advisor.measure.contest import Contest
from advisor.measure.stopping import TimingPolicy
from advisor.measure.verdict import PrecisionCheckSettings

SPACE_SCHEMA_VERSION: Literal[1] = 1


class Budget(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    trials: int = Field(64, gt=0, description="most candidates measured")
    time_s: float = Field(900.0, gt=0, description="stop starting new trials after this")


class Tolerances(BaseModel):
    """Largest accepted ‖out−ref‖/‖ref‖ against fp32 with TF32 off, per precision."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    fp32: float = Field(1e-4, gt=0)
    tf32: float = Field(5e-3, gt=0)
    fp16: float = Field(1e-2, gt=0)
    bf16: float = Field(2e-2, gt=0)

    def for_precision(self, precision: str) -> float:
        return float(getattr(self, precision))


class GateSettings(BaseModel):
    """How the model-level tolerance is calibrated on the model itself (see advisor/gate/numeric.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    perturbations: int = Field(
        4, ge=0, description="perturbed fp32 references whose spread is the noise floor"
    )
    perturbation: float = Field(
        1e-5, gt=0, description="relative size of each perturbation of the inputs"
    )
    noise_factor: float = Field(
        4.0, ge=1, description="an fp32 candidate may differ by this times the noise floor"
    )
    yardstick_factor: float = Field(
        2.0,
        ge=1,
        description="a TF32/fp16/bf16 candidate may differ by this times PyTorch's own path at "
        "that precision",
    )


class TimingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    warmup_runs: int = Field(2, ge=0)
    warmup_s: float = Field(0.05, ge=0)
    min_samples: int = Field(7, ge=3)
    max_samples: int = Field(200, ge=3)
    target_rel_ci: float = Field(0.02, gt=0)
    max_time_s: float = Field(1.5, gt=0)
    min_sample_ms: float = Field(
        0.0, ge=0, description="repeat a shorter step back to back within one sample (0: off)"
    )
    max_reps: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _samples_in_order(self) -> TimingSettings:
        if self.min_samples > self.max_samples:
            raise ValueError(
                f"min_samples ({self.min_samples}) is more than max_samples ({self.max_samples})"
            )
        return self

    def policy(self) -> TimingPolicy:
        return TimingPolicy(**self.model_dump())


class SearchSpace(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SPACE_SCHEMA_VERSION
    name: str
    description: str = ""
    device: Literal["cpu", "cuda", "any"] = "any"
    knobs: dict[str, list[Any]]
    skip: list[dict[str, Any]] = Field(
        default_factory=list, description="partial assignments never to try (`_matches`)"
    )
    budget: Budget = Budget()
    tolerances: Tolerances = Tolerances()
    grad_tolerances: Tolerances = Field(
        Tolerances(fp32=1e-4, tf32=1e-2, fp16=1e-1, bf16=1e-1),
        description="for all parameter and input gradients together (train mode)",
    )
    layer_tolerances: Tolerances = Field(
        Tolerances(fp32=1e-4, tf32=2e-3, fp16=3e-3, bf16=1e-2),
        description="each conv layer alone against float64: output, input and weight gradients",
    )
    gate: GateSettings = GateSettings()
    precision_check: PrecisionCheckSettings = Field(
        PrecisionCheckSettings(),
        description="whether a reduced precision trains like fp32 on the model "
        "(advisor/gate/precision.py)",
    )
    timing: TimingSettings = TimingSettings()
    min_gain: float = Field(
        0.02, ge=0, description="a change must be faster by this fraction (and significantly)"
    )
    retime_top: int = Field(
        3, ge=0, description="re-time this many finalists (and the default) interleaved; 0: off"
    )
    per_layer: bool = Field(True, description="choose conv implementations per layer for models")
    race: bool = Field(
        True,
        description="stop sampling a candidate once a sign test shows it slower than the best "
        "(it is then not gated); false: every candidate measured and gated in full (none raced "
        "or screened)",
    )
    race_margin: float = Field(
        1.5,
        ge=1.0,
        description="a candidate is stopped only when slower than the best by this factor (and "
        "min_gain): its first samples after warm-up can be this much slower than its steady state",
    )
    compile_max_gain: float | None = Field(
        None,
        gt=1.0,
        description="the most torch.compile is assumed to speed up its eager twin: settings whose "
        "eager time is slower than the best eager candidate's by more than this factor (beyond "
        "both intervals) are not compiled, since their compile could not change the answer; "
        "null: every base of the compile stage is compiled",
    )

    def contest(self, steps: int | None = None) -> Contest:
        """The rule that decides whether a candidate can still win, with this space's margins
        and the horizon `steps` (--steps; `HORIZON_STEPS` when not told)."""
        return Contest(min_gain=self.min_gain, race_margin=self.race_margin,
                       compile_max_gain=self.compile_max_gain, racing=self.race, steps=steps)  # fmt: skip

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, knobs: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out = {}
        for name, values in knobs.items():
            if name not in KNOBS:
                raise ValueError(f"unknown knob {name!r}; knobs: {', '.join(KNOB_NAMES)}")
            if not values:
                raise ValueError(f"knob {name!r} has no values")
            values = [_knob_value(name, v) for v in values]
            out[name] = list(dict.fromkeys(values))
        return out

    @field_validator("skip")
    @classmethod
    def _known_skip_keys(cls, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for rule in rules:
            checked = {}
            for key, value in rule.items():
                if key == "device":
                    if value not in ("cpu", "cuda"):
                        raise ValueError(f"skip rule device {value!r} is not one of cpu, cuda")
                    checked[key] = value
                elif key in ("why", "cpu_bf16_kernels"):
                    kind = str if key == "why" else bool
                    if not isinstance(value, kind):
                        raise ValueError(f"skip rule {key}: {value!r} is not a {kind.__name__}")
                    checked[key] = value
                elif key in KNOBS:
                    checked[key] = _knob_value(key, value, "skip rule")
                else:
                    raise ValueError(f"skip rule names unknown knob {key!r}")
            out.append(checked)
        return out


def _knob_value(name: str, value: Any, where: str = "knob") -> Any:
    """`value` as knob `name` takes it, or a ValueError naming the valid values.

    YAML 1.1 reads bare off/on as booleans: they are taken back for the string-valued knobs (tf32,
    amp), so `{amp: off}` in a skip rule matches amp="off" instead of nothing."""
    if name in ("tf32", "amp", "compile") and isinstance(value, bool):
        value = "on" if value else "off"
    if name == "conv_impl":
        if value not in conv_impls.names():
            raise ValueError(
                f"unknown conv implementation {value!r}; known: {', '.join(conv_impls.names())}"
            )
        return value
    try:
        # Each value must be valid for its knob; the validated form (channels_last_3d ->
        # channels_last) is what candidates carry, so a skip rule compares like for like.
        return getattr(Settings(**{name: value}), name)
    except ValidationError:
        valid = ", ".join(str(v) for v in KNOBS[name].values)
        raise ValueError(
            f"{where} value {value!r} is not valid for {name}; one of: {valid}"
        ) from None


@dataclass(frozen=True)
class Dropped:
    """A knob value, or a combination, that is not searched here, and why."""

    what: str
    reason: str


def builtin_space_names() -> list[str]:
    files = resources.files("search_spaces")
    return sorted(p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml"))


def load_space(name_or_path: str | Path | None, device: torch.device) -> SearchSpace:
    """A built-in space by name ('cpu', 'cuda', ...), a file path, or the default for `device`."""
    if name_or_path is None:
        name_or_path = "cuda" if device.type == "cuda" else "cpu"
    text: str
    where = str(name_or_path)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        check_file(path, "search-space file", SpaceError)
        text = path.read_text()
    else:
        builtin = resources.files("search_spaces") / f"{name_or_path}.yaml"
        if not builtin.is_file():
            raise SpaceError(
                f"unknown search space {name_or_path!r}; built-in: {', '.join(builtin_space_names())}"
            )
        text = builtin.read_text()
    try:
        data = json.loads(text) if where.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise SpaceError(
            f"cannot parse search space {where}: {first_line(e, with_type=False)}"
        ) from None
    except (RecursionError, MemoryError):
        raise SpaceError(f"cannot parse search space {where}: too deeply nested") from None
    if not isinstance(data, dict):
        raise SpaceError(f"search space {where} must be a mapping")
    try:
        space = SearchSpace(**data)
    except ValidationError as e:
        raise SpaceError(validation_message(e, f"search space {where}")) from None
    if space.device != "any" and space.device != device.type:
        raise SpaceError(f"search space {space.name!r} is for {space.device}, not {device.type}")
    return space


_GATE_SECTIONS = ("tolerances", "grad_tolerances", "layer_tolerances", "gate", "precision_check")


def with_tolerances(space: SearchSpace, overrides: dict[str, float]) -> SearchSpace:
    """`space` with numeric-gate settings replaced, e.g. {"grad_tolerances.fp32": 2e-3} (what
    `--tolerance KEY=VALUE` gives). Unknown keys and invalid values are one-line errors."""
    if not overrides:
        return space
    data = space.model_dump()
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if section not in _GATE_SECTIONS or field not in data[section]:
            fields = [f"{s}.{f}" for s in _GATE_SECTIONS for f in data[s]]
            raise SpaceError(f"unknown tolerance {key!r}; one of: {', '.join(fields)}")
        data[section][field] = value
    try:
        return SearchSpace(**data)
    except ValidationError as e:
        raise SpaceError(validation_message(e, "tolerance")) from None


def _matches(rule: dict[str, Any], settings: Settings, device: torch.device) -> bool:
    """Whether a skip rule leaves `settings` out on `device`: its knobs, `device` (the kind)
    and `cpu_bf16_kernels` (`environment.cpu_bf16_kernels`) match; `why` is what the user reads."""
    machine = {"device": device.type, "cpu_bf16_kernels": environment.cpu_bf16_kernels(device)}
    return all(
        key == "why" or (machine[key] if key in machine else getattr(settings, key)) == value
        for key, value in rule.items()
    )


AUTOCAST_CONVS = (
    "under autocast every conv runs in the autocast dtype, so the fp32 conv precision changes "
    "nothing: the same candidate as with cpu_fp32=ieee"
)


def candidates(
    space: SearchSpace,
    device: torch.device,
    impls: list[str] | None = None,
    param_dtype: torch.dtype = torch.float32,
) -> tuple[list[Settings], list[Dropped]]:
    """Every Settings to try on `device` (PyTorch's default first) and what was left out, why.

    `impls`, when given, restricts conv_impl to those values (the ones that can run the workload:
    the caller says why the others are left out, where they would have been searched);
    `param_dtype` is the workload's (a layer spec may be fp16: fp16 autocast means nothing there).
    """
    dropped: list[Dropped] = []
    axes: dict[str, list[Any]] = {}
    for name in KNOB_NAMES:
        knob = KNOBS[name]
        values = space.knobs.get(name, [knob.default])
        reason = knob.why_not(device)
        if reason:
            if values != [knob.default]:
                dropped.append(Dropped(name, reason))
            values = [knob.default]
        if name == "amp":
            kept = []
            for v in values:
                why = amp_why_not(v, device, param_dtype)
                if why:
                    dropped.append(Dropped(f"amp={v}", why))
                else:
                    kept.append(v)
            values = kept or ["off"]
        if name == "compile":
            values = ["off"]  # compiled candidates come after the eager ones: `compile_modes`
        if name == "cudnn_benchmark":
            # Tried on the finalists, not across the grid (`benchmark_finalists`): each value
            # of a candidate's dtype and layout pays cuDNN's search again (seconds on a GPU).
            values = [knob.default]
        if name == "conv_impl" and impls is not None:
            values = [v for v in values if v in impls] or ["native"]
        axes[name] = values
    out: list[Settings] = []
    default = Settings()
    redundant = 0
    said: dict[str, str] = {}  # a rule's knobs -> its why, for the rules that skipped one
    for combo in itertools.product(*axes.values()):
        s = Settings(**dict(zip(axes, combo, strict=True)))
        rule = next((r for r in space.skip if _matches(r, s, device)), None)
        if s != default and rule is not None:
            if "why" in rule:
                said[", ".join(f"{k}={v}" for k, v in rule.items() if k in KNOBS)] = rule["why"]
            continue
        if s.amp != "off" and s.cpu_fp32 != "ieee":
            redundant += 1  # the same computation as its cpu_fp32=ieee twin: not timed twice
            continue
        out.append(s)
    dropped += [Dropped(what, why) for what, why in said.items()]
    if redundant:
        dropped.append(Dropped("cpu_fp32=bf16 with amp", AUTOCAST_CONVS))
    if default in out:
        out.remove(default)
    return [default, *out], dropped


def benchmark_finalists(space: SearchSpace, device: torch.device) -> bool:
    """Whether `cudnn.benchmark=True` is tried, on the eager search's finalists
    (`advisor.stages.benchmark_twins`): the space lists it and the device has cuDNN."""
    return KNOBS["cudnn_benchmark"].why_not(device) is None and True in space.knobs.get(
        "cudnn_benchmark", []
    )


def compile_modes(space: SearchSpace, device: torch.device) -> tuple[list[str], list[Dropped]]:
    """The torch.compile modes the space lists that mean something on `device` (in the space's
    order, "off" left out), and those left out, why. They are tried after the eager search, on
    the best eager settings (`advisor.stages.compiling`), not crossed with every eager candidate."""
    modes, dropped = [], []
    for mode in space.knobs.get("compile", []):
        if mode == "off":
            continue
        why = compile_why_not(mode, device)
        if why:
            dropped.append(Dropped(f"compile={mode}", why))
        else:
            modes.append(mode)
    return modes, dropped
