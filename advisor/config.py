"""The recommendation file: a frozen pydantic model, saved as JSON, validated on load."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from advisor.device.environment import Environment
from advisor.errors import ConfigError, OutputError, check_file, first_line, validation_message
from advisor.knobs import Settings
from advisor.workload.info import WorkloadInfo, parse_info

CONFIG_SCHEMA_VERSION: Final = 1


class Timing(BaseModel):
    """A median with its 95% confidence interval, in milliseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    iqr_ms: float
    samples: int


class FinalCheck(BaseModel):
    """The recommendation re-timed against PyTorch's default where the user runs it: in a fresh
    process built as `advisor.apply` builds it (or, where the workload cannot be rebuilt there
    or the run was in-process, in this process on fresh copies), interleaved, paired by round."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    where: Literal["fresh process", "this process"]
    speedup: float = Field(
        description="the recommendation over the default: median per-round ratio"
    )
    speedup_ci: tuple[float, float]
    rounds: int
    held: bool = Field(
        description="the interval lies above 1.0x and reaches 1 + min_gain "
        "(and at one thread, when busy, lies above 1.0x)"
    )
    one_thread: tuple[float, float, float] | None = Field(
        None,
        description="on a busy CPU, the same at one torch thread (speedup, low, high): a win "
        "that only shows while threads wait on each other is not kept",
    )
    first_call_s: float | None = Field(
        None, description="the recommendation's first call there (a compile from warm caches)"
    )
    other_load: float | None = Field(
        None, description="other processes' share of the CPU during the check"
    )
    runner_up: Settings | None = Field(
        None,
        description="the strongest alternative of another family (memory format or precision), "
        "timed beside the recommendation and the default",
    )
    runner_up_first_call_s: float | None = Field(
        None, description="the runner-up's first call there (a compile from warm caches)"
    )
    runner_up_speedup: tuple[float, float, float] | None = Field(
        None, description="the runner-up over the default: ratio, 95% interval"
    )
    runner_up_held: bool | None = Field(
        None, description="the runner-up's interval holds as `held` asks"
    )
    versus_runner_up: tuple[float, float, float] | None = Field(
        None, description="the runner-up over the recommendation, paired by round"
    )
    order: Literal["pick", "runner-up", "undecided"] | None = Field(
        None,
        description="which of the two this machine tells faster beyond noise, or undecided",
    )
    measured: list[tuple[int, list[float]]] = Field(
        default_factory=list,
        description="its raw samples, (calls per sample, ms per call): the default's, the "
        "recommendation's, a runner-up's (then the same at one thread, on a busy CPU)",
    )
    challenger: Settings | None = Field(
        None,
        description="where the search kept PyTorch's default: the fastest eager alternative "
        "it measured (gated), timed here against the default in its place (the figures above "
        "are its); recommended where it held",
    )

    @property
    def place(self) -> str:
        return "in a fresh process" if self.where == "fresh process" else "in this process"

    def figures(self) -> str:
        """The speedup with its interval and rounds (and at one thread), for a sentence."""
        lo, hi = self.speedup_ci
        text = f"{self.speedup:.2f}x [{lo:.2f}, {hi:.2f}] the default's speed over {self.rounds} rounds"
        if self.one_thread is not None:
            one, lo1, hi1 = self.one_thread
            text += f"; at one thread {one:.2f}x [{lo1:.2f}, {hi1:.2f}]"
        return text

    def runner_up_text(self) -> str:
        """The runner-up's figures, for a sentence ('' without one)."""
        if self.runner_up is None or self.runner_up_speedup is None:
            return ""
        r, lo, hi = self.runner_up_speedup
        text = f"{self.runner_up.label()} {r:.2f}x [{lo:.2f}, {hi:.2f}] the default's speed"
        if self.versus_runner_up is not None:
            v, vlo, vhi = self.versus_runner_up
            text += f", {v:.2f}x [{vlo:.2f}, {vhi:.2f}] the recommendation's"
        return text

    def summary(self) -> str:
        """The check in one line."""
        load = ("" if self.other_load is None
                else f"; other processes used {self.other_load:.0%} of the CPU meanwhile")  # fmt: skip
        what = "" if self.challenger is None else f"{self.challenger.label()} "
        verdict = ("it held" if self.held else "it did not hold") if self.challenger is None else (
            "it beat the default" if self.held else "it did not beat the default")  # fmt: skip
        return (
            f"{what}{self.place}, interleaved with the default: {self.figures()}"
            f"{load}: "
            + verdict
            + (f"; runner-up {self.runner_up_text()}" if self.runner_up is not None else "")
        )


class Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    baseline: Timing
    tuned: Timing
    speedup: float = Field(description="the final check's where it decided, else the re-time's")
    speedup_ci: tuple[float, float]
    rel_error: float = Field(description="‖out−ref‖/‖ref‖ of the tuned settings vs fp32 reference")
    grad_error: float | None = Field(None, description="all parameter gradients together (train)")
    precision: str
    tolerance: float
    peak_memory_mb: float | None = None
    why: str = Field(
        description="what was picked and the measurement that decided it, in one sentence"
    )
    path: list[str] = Field(
        default_factory=list, description="how the pick got there, a sentence a step"
    )
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
    precisions: list[str] = Field(
        default_factory=list,
        description="how each reduced precision was judged on this model (bf16: trains like fp32 "
        "...), by a short training run (train) or the outputs' information (infer)",
    )
    trials: int
    rejected: int
    failed: int
    stopped: int = Field(0, description="candidates stopped early: provably slower than the best")
    tuning_s: float
    payback: str | None = Field(
        None, description="how many steps of the pick pay back the tuning's own wall time"
    )
    notes: list[str] = Field(
        default_factory=list, description="what the time budget left out, what was reused"
    )
    compile_note: str | None = Field(
        None, description="what torch.compile costs and saves here, and when it pays"
    )
    steps: int | None = Field(None, description="the training steps the run was tuned for")
    other_load: float | None = Field(
        None, description="other processes' share of the machine's CPU time during tuning"
    )
    final_check: FinalCheck | None = Field(
        None, description="the recommendation re-timed where the user runs it"
    )
    stage_s: dict[str, float] = Field(
        default_factory=dict,
        description="the run's wall time by stage, in order (advisor.stages.walltime): a "
        "'stage: part' key is part of that stage (precision checks, Inductor start, cold "
        "compiles)",
    )
    effort: Literal["quick", "default", "full"] = Field(
        "default", description="the run's effort level (advisor.stages.effort)"
    )
    answer: Literal["eager", "final"] = Field(
        "final",
        description="eager: the answer before the compile stage, written while it ran (a run "
        "interrupted there leaves it); final: the run's last word",
    )


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
    # The workload's info as JSON (advisor.workload.info) plus the study's name; kept a plain
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
    atomic_write_all({path: text})


def output_paths(path: str | Path) -> list[Path]:
    """The files `Advice.save(path)` may write: the config, its trials CSV, its per-layer CSV."""
    path = Path(path)
    return [
        path,
        path.with_name(path.stem + ".trials.csv"),
        path.with_name(path.stem + ".layers.csv"),
    ]


def _why(e: OSError) -> str:
    return e.strerror or first_line(e, with_type=False)


def check_outputs(paths: Sequence[str | Path]) -> None:
    """OutputError naming the first of `paths` that could not be written: checked before a long
    search, so a bad `--out` is found at once, not after it. Each path must not be a folder (or
    another non-file), and its folder must exist and be writable, or be creatable."""
    probed: set[Path] = set()
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise OutputError(f"cannot write {path}: it is a directory")
        if path.exists() and not path.is_file():
            raise OutputError(f"cannot write {path}: it is not a regular file")
        existing = path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise OutputError(f"cannot write {path}: {existing} is not a directory")
        if existing in probed:
            continue
        try:  # the one test that cannot be fooled (read-only file systems, ACLs, root)
            fd, probe = tempfile.mkstemp(dir=existing, prefix=".advisor-probe-", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise OutputError(f"cannot write {path}: {existing}: {_why(e)}") from None
        probed.add(existing)


def atomic_write_all(files: Mapping[Path, str | bytes]) -> None:
    """Write several files as one: all of them, or none (files that were there are left as they
    were). Every file is first written to a temporary name beside it, then all are renamed into
    place; when a step fails, what was written is removed and the old files are put back, and an
    OutputError names the file that failed."""
    created: list[Path] = []  # folders made here, to remove on failure
    temps: dict[Path, str] = {}
    backups: dict[Path, str | None] = {}  # replaced path -> its old contents' copy (None: new)
    current: Path | None = None
    try:
        for path, payload in files.items():
            current = path
            missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
            path.parent.mkdir(parents=True, exist_ok=True)
            created += reversed(missing)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temps[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(payload.encode("utf-8") if isinstance(payload, str) else payload)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a config is an ordinary file
        for path, tmp in list(temps.items()):
            current = path
            if path.is_dir():
                raise IsADirectoryError(21, "Is a directory")
            backups[path] = _backup(path) if path.exists() else None
            os.replace(tmp, path)
            del temps[path]
    except BaseException as e:
        for path, backup in backups.items():
            with contextlib.suppress(OSError):
                if path not in temps:  # renamed into place: put the old file back, or remove it
                    if backup is not None:
                        os.replace(backup, path)
                    else:
                        path.unlink(missing_ok=True)
                elif backup is not None:
                    os.unlink(backup)
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(f"cannot write {current}: {_why(e)}; nothing was written") from None
        raise
    for backup in backups.values():
        if backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(backup)


def _backup(path: Path) -> str:
    """A copy of `path`'s current contents beside it (a hard link where possible), to put back."""
    fd, backup = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old")
    os.close(fd)
    try:
        os.unlink(backup)
        os.link(path, backup)
    except OSError:
        shutil.copy2(path, backup)
    return backup


def save_config(config: Config, path: str | Path) -> Path:
    path = Path(path)
    atomic_write(path, config.model_dump_json(indent=2) + "\n")
    return path


def load_config(path: str | Path) -> Config:
    path = Path(path)
    check_file(path, "config file", ConfigError)
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
