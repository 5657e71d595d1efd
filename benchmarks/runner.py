"""The one advise runner: `advisor advise` as a user types it, in a subprocess, timed end to end.

    python -m advisor advise MODEL --mode M --device D --effort E --storage memory --out cfg.json

runs from a tree (this checkout, or a worktree of another revision: benchmarks/plan.py's
compare), with that tree first on PYTHONPATH so its advisor, not the installed one, runs. The
wall time includes Python's start-up and imports; the eager answer's time is when the run
printed its `Eager answer:` line (default and full effort print it before the compile stage).
A run that outlives its limit gets Ctrl-C (SIGINT to its process group), as a user would send
it, and `GRACE_S` to end as Ctrl-C ends it (an eager answer written stays); then it is killed.

What the run wrote is read through one adapter, `row_from_config`: the only place that knows the
config's fields.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.registry import ROOT, Model
from benchmarks.table import child_env

EAGER = "Eager answer:"
GRACE_S = 10.0  # after Ctrl-C, for the advisor to end as Ctrl-C ends it
TAIL_LINES = 40
# PyTorch's defaults as a config writes them: left out of a pick's label
DEFAULTS = {"memory_format": "contiguous", "tf32": "conv", "amp": "off", "cudnn_benchmark": False,
            "conv_impl": "native", "cpu_fp32": "ieee", "compile": "off"}  # fmt: skip


def label(settings: dict[str, Any]) -> str:
    """A pick's settings as the advisor names them (`Settings.label()`: 'memory_format=
    channels_last, amp=bf16, layers: 2x unfold_gemm', or 'default'); a config of another
    revision that this tree's Settings does not read, without PyTorch's defaults."""
    from pydantic import ValidationError

    from advisor.knobs import Settings

    try:
        return Settings.model_validate(settings).label()
    except (ValidationError, TypeError, ValueError):
        pass
    parts = [f"{k}={v}" for k, v in settings.items()
             if k != "layers" and v not in (None, {}) and str(DEFAULTS.get(k)) != str(v)]  # fmt: skip
    counts: dict[str, int] = {}
    for impl in (settings.get("layers") or {}).values():
        counts[impl] = counts.get(impl, 0) + 1
    if counts:
        parts.append("layers: " + ", ".join(f"{n}x {i}" for i, n in sorted(counts.items())))
    return ", ".join(parts) or "default"


def row_from_config(data: dict[str, Any]) -> dict[str, Any]:
    """The table's fields from a config file's JSON (advisor/config.py), and nothing else reads
    it. Reads `settings` and, of `result`: speedup, speedup_ci, why, final_check (where, speedup,
    speedup_ci, rounds, held), stage_s, tuning_s, other_load, effort, answer, trials, rejected,
    notes, compile_note. A field the config lacks is None."""
    from advisor.stages.walltime import harness_share

    res = data.get("result") or {}
    stage_s = res.get("stage_s") or {}
    fc = res.get("final_check")
    return {
        "settings": data.get("settings"),
        "pick": label(data.get("settings") or {}),
        "claimed_speedup": res.get("speedup"),
        "claimed_ci": res.get("speedup_ci"),
        "why": res.get("why"),
        "final_check": None if not fc else {k: fc.get(k) for k in
                                            ("where", "speedup", "speedup_ci", "rounds", "held")},
        "stage_s": stage_s or None,
        "harness_share": harness_share(stage_s) if stage_s else None,
        "harness_share_gate_apart": harness_share(stage_s, gate_apart=True) if stage_s else None,
        "tuning_s": res.get("tuning_s"),
        "other_load": res.get("other_load"),
        "effort_run": res.get("effort"),
        "answer": res.get("answer"),
        "trials": res.get("trials"),
        "rejected": res.get("rejected"),
        "notes": res.get("notes") or [],
        "compile_note": res.get("compile_note"),
    }  # fmt: skip


def advise_command(model: Model, mode: str, effort: str | None, device: str, out: Path,
                   storage: str | None = "memory", extra: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    cmd = [sys.executable, "-m", "advisor", "advise", *model.target(device), "--mode", mode,
           "--device", device]  # fmt: skip
    if effort is not None:  # a revision from before effort levels has no --effort
        cmd += ["--effort", effort]
    if storage is not None:
        cmd += ["--storage", storage]
    return [*cmd, "--out", str(out), *extra]


def shown(cmd: list[str], *folders: Path) -> str:
    """The command as a user types it: `advisor advise ...`, paths relative to the trees."""
    text = "advisor " + shlex.join(cmd[3:])
    for f in folders:
        text = text.replace(str(f) + "/", "")
    return text


def compiled(tree: Path) -> None:
    """`tree`'s advisor compiled to bytecode before a run's clock starts, as an install compiles
    a package: every run reads .pyc files, whether or not $PYTHONDONTWRITEBYTECODE lets Python
    write them (else each run would compile every module from source). Only modules changed
    since their .pyc are compiled again (milliseconds where none did)."""
    compileall.compile_dir(str(tree / "advisor"), quiet=1)


def advise(model: Model, mode: str, effort: str | None, device: str, *, limit_s: float,
           work: Path, tree: Path = ROOT, storage: str | None = "memory",
           extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
           log: Any = print) -> dict[str, Any]:  # fmt: skip
    """One advise run (the module's docstring). Returns its fields for the table: the command,
    `wall_s`, `eager_s`, `exit_code`, `status` ('ok', 'stopped at ...', or why it failed),
    `config` (the path it wrote, in `work`), then `row_from_config`'s."""
    cfg = work / f"{model.name}.{mode}.{effort or 'none'}.{os.getpid()}.{time.monotonic_ns()}.json"
    cmd = advise_command(model, mode, effort, device, cfg, storage, extra)
    run: dict[str, Any] = {"advise_command": shown(cmd, tree, ROOT).replace(str(cfg), "cfg.json")}
    lines: list[str] = []
    eager: list[float] = []
    compiled(tree)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tree, env=child_env(tree, env), start_new_session=True)  # fmt: skip

    def read() -> None:  # the run's output as it prints it: when the eager answer came
        assert proc.stdout is not None
        for line in proc.stdout:
            if not eager and EAGER in line:
                eager.append(time.perf_counter() - t0)
            lines.append(line.rstrip())
            del lines[:-TAIL_LINES]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            proc.wait(timeout=max(limit_s, 0.1))
        except subprocess.TimeoutExpired:
            run["stopped_s"] = round(time.perf_counter() - t0, 2)
            with contextlib.suppress(ProcessLookupError):  # Ctrl-C, to its whole process group
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        run["wall_s"] = round(time.perf_counter() - t0, 3)
    finally:  # its workers, had any outlived it; the run itself, had this one been interrupted
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=5)
    run["eager_s"] = round(eager[0], 3) if eager else None
    run["exit_code"] = proc.returncode
    run["output_tail"] = "\n".join(lines[-TAIL_LINES:])
    if "stopped_s" in run:
        run["status"] = f"stopped at its limit ({limit_s:.0f} s)" + (
            "" if cfg.exists() else ": no answer written")
    elif proc.returncode != 0 or not cfg.exists():
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
        run["status"] = f"failed: {last[:300]}"
    else:
        run["status"] = "ok"
    if cfg.exists():
        import json

        run["config"] = str(cfg)
        run.update(row_from_config(json.loads(cfg.read_text())))
    log(f"  {model.name} {mode} {effort}: {run['wall_s']:.1f} s, "
        f"{run.get('pick', run['status'])}")  # fmt: skip
    return run
