"""The recommendation file: a frozen pydantic model, saved as JSON, validated on load."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from advisor.environment import Environment
from advisor.errors import ConfigError, first_line, validation_message
from advisor.knobs import Settings
from advisor.workload_info import WorkloadInfo, parse_info

CONFIG_SCHEMA_VERSION: Final = 1


class Timing(BaseModel):
    """A median with its 95% confidence interval, in milliseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    iqr_ms: float
    samples: int


class Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    baseline: Timing
    tuned: Timing
    speedup: float
    speedup_ci: tuple[float, float]
    rel_error: float = Field(description="‖out−ref‖/‖ref‖ of the tuned settings vs fp32 reference")
    grad_error: float | None = Field(None, description="all parameter gradients together (train)")
    precision: str
    tolerance: float
    peak_memory_mb: float | None = None
    why: str = Field(description="why these settings were picked")
    min_gain: float = Field(0.02, description="the space's min_gain the pick was made with")
    warnings: list[str] = Field(
        default_factory=list, description="what may make these measurements less reliable"
    )
    benchmark_note: str | None = Field(
        None, description="whether cudnn.benchmark pays for this shape set (CUDA)"
    )
    rejected_faster: list[str] = Field(
        default_factory=list,
        description="candidates faster than the recommendation that the numeric gate rejected: "
        "each with its error and the --tolerance setting that would accept it",
    )
    trials: int
    rejected: int
    failed: int
    tuning_s: float


class Config(BaseModel):
    """What `advisor advise` writes and `advisor.apply` reads. `settings` may be edited by hand."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = CONFIG_SCHEMA_VERSION
    advisor_version: str
    created: str = Field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    mode: Literal["infer", "train"]
    settings: Settings
    environment: Environment
    # The workload's info as JSON (advisor.workload_info) plus the study's name; kept a plain
    # mapping in the file so configs of any workload kind load. Typed: `workload_info`.
    workload: dict[str, Any]
    space: str
    result: Result | None = None

    @property
    def workload_info(self) -> WorkloadInfo:
        """The workload's typed description (what `workload_from_info` rebuilds it from)."""
        return parse_info(self.workload)


def config_schema() -> dict[str, Any]:
    return Config.model_json_schema()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves a half-written file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """`atomic_write` for bytes (also the report's PNGs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a config is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_config(config: Config, path: str | Path) -> Path:
    path = Path(path)
    atomic_write(path, config.model_dump_json(indent=2) + "\n")
    return path


def load_config(path: str | Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(
            f"config {path} is not valid JSON: {first_line(e, with_type=False)}"
        ) from None
    if not isinstance(data, dict) or "settings" not in data or "schema_version" not in data:
        raise ConfigError(f"{path} is not an advisor config (no schema_version/settings)")
    if data.get("schema_version") != CONFIG_SCHEMA_VERSION:
        raise ConfigError(
            f"config {path} has schema_version {data.get('schema_version')!r}; "
            f"this advisor reads {CONFIG_SCHEMA_VERSION}"
        )
    try:
        return Config(**data)
    except ValidationError as e:
        raise ConfigError(validation_message(e, f"config {path}")) from None
