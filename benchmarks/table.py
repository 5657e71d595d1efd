"""The results table and the environment record on each of its rows.

One committed table, `benchmarks/results/runs.jsonl`: one JSON object a line, appended by every
run (whole lines, one write each: a run cut short leaves every row it finished and no half
line). A row is one `advisor advise` run of one model, keyed by

    (machine, commit, model, mode, effort)

and carries the environment it ran in (`env`), the run's cost (`wall_s`, `eager_s`, the harness
share, `stage_s`), the pick with its claimed speedup and the final check, and, where the model
was re-timed, what the advice is worth (`worth`: PyTorch's default, the pick, the hand setting
and torch.compile, each in a fresh process; benchmarks/retime.py). Rows imported from the
result files of earlier scripts name their file and the commit that added it (`source`).
Raw samples stay out of the table unless asked for (`--samples DIR`).

`machine` is the hardware's fingerprint: the CPU's name with its family and model numbers, its
vector ISA, the torch threads and logical CPUs, the GPU's name, capability and memory. Library
versions are not in it (a torch upgrade is the same machine, a new row): they are in `env`, with
the advisor's own `fingerprint` (hardware and libraries, what a config is checked against).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.registry import ROOT, UsageError

TABLE = ROOT / "benchmarks" / "results" / "runs.jsonl"
SCHEMA = 1
KEY = ("machine", "commit", "model", "mode", "effort")
# Every row has these (None where not measured); a reader may rely on them.
REQUIRED = ("schema", *KEY, "env", "dirty", "date", "command", "status")
# The libraries whose versions a row records (None where not installed)
LIBRARIES = ("torch", "triton", "numpy", "optuna", "pandas", "pydantic", "transformers", "timm",
             "monai", "torchvision", "lightning")  # fmt: skip

_ENV_CODE = """
import importlib.metadata as md, json, os, sys, torch
from advisor.device.environment import cpu_has_bf16_units, current_environment
env = current_environment(sys.argv[1]).model_dump(mode="json")
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
env.update(logical_cpus=os.cpu_count(),
           torch_threads=torch.get_num_threads(), bf16_units=cpu_has_bf16_units(),
           libraries={n: version(n) for n in json.loads(sys.argv[2])})
if env["device_type"] == "cpu":
    env["cpu_capability"] = env["capability"]
print(json.dumps(env))
"""


def environment(device: str, tree: Path = ROOT) -> dict[str, Any]:
    """The machine and library versions, read in a fresh process of `tree`'s advisor (this one
    never initialises CUDA): the advisor's Environment, the CPU's description, logical CPUs,
    torch threads, whether the CPU has bf16 units, and the libraries' versions."""
    r = subprocess.run([sys.executable, "-c", _ENV_CODE, device, json.dumps(LIBRARIES)],
                       capture_output=True, text=True, cwd=tree, env=child_env(tree),
                       timeout=300)  # fmt: skip
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()] or ["no output"]
        raise UsageError(f"cannot read the environment for --device {device}: {lines[-1]}")
    env: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    env["cpu_model"] = cpu_description()  # the same machine's: not the tree's to say
    return env


def cpu_description() -> str:
    """The CPU's name with its x86 family and model where /proc/cpuinfo has them: a virtual
    machine names Zen 4 and Zen 5 EPYCs alike ("AMD EPYC"), family 25 and 26, and their
    timings differ (for benchmark tables, not for keys)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    family, model = fields.get("cpu family"), fields.get("model")
    return name + (f" (family {family} model {model})" if family and model else "")


def child_env(tree: Path = ROOT, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that must run `tree`'s advisor (not the installed
    one): `tree` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return {**env, **(extra or {})}


def machine_id(env: dict[str, Any]) -> str:
    """The hardware's fingerprint as a readable slug: 'cpu-amd-epyc-f25m17-2t-1a2b3c'. Two rows
    of one machine share it across library versions; the hash covers every hardware field."""
    fields = {k: env.get(k) for k in ("device_type", "cpu_model", "cpu_capability",
                                      "logical_cpus", "torch_threads")}  # fmt: skip
    if env.get("device_type") == "cuda":
        fields.update(gpu=env.get("device_name"), gpu_capability=env.get("capability"),
                      gpu_memory_gb=env.get("device_memory_gb"))  # fmt: skip
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:6]
    name = env.get("device_name") if env.get("device_type") == "cuda" else env.get("cpu_model")
    return f"{env.get('device_type', 'cpu')}-{slug(str(name or 'unknown'))}-" \
           f"{env.get('torch_threads') or '?'}t-{digest}"  # fmt: skip


def slug(text: str) -> str:
    """'Intel(R) Xeon(R) Processor @ 2.80GHz (family 6 model 106)' -> 'intel-xeon-f6m106'."""
    text = re.sub(r"@[^(]*", "", text)  # the clock, up to the family and model where they follow
    text = re.sub(r"\(family (\d+) model (\d+)\)", r"f\1m\2", text)
    text = re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b", "", text, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "unknown"


def git_state(tree: Path = ROOT) -> tuple[str | None, bool | None]:
    """`tree`'s commit (10 hex digits) and whether the code a run measures differs from it
    (advisor/, search_spaces/, benchmarks/ less its results); (None, None) without git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=tree, text=True,
                             capture_output=True, timeout=30, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "advisor", "search_spaces", "benchmarks",
             ":(exclude)benchmarks/results"],
            cwd=tree, text=True, capture_output=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return sha, bool(status.strip())


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ======================================================================== reading and writing


def validate(row: dict[str, Any], where: str = "a row") -> None:
    """ValueError naming what is wrong with a row (a missing field, another schema)."""
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    if row["schema"] != SCHEMA:
        raise ValueError(f"{where} has schema {row['schema']!r}, not {SCHEMA}")


def read(path: Path = TABLE) -> list[dict[str, Any]]:
    """Every row of the table, in the order appended; [] where there is no table yet.
    UsageError naming the first line that is not a row."""
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            validate(row, "it")
        except ValueError as e:
            raise UsageError(f"{path}:{n}: not a row of the table: {e}") from None
        rows.append(row)
    return rows


def append(rows: list[dict[str, Any]], path: Path = TABLE) -> None:
    """Append `rows`, each as one line, in one write: a reader never sees half a row."""
    if not rows:
        return
    for row in rows:
        validate(row)
    text = "".join(json.dumps(r, sort_keys=False, separators=(",", ":")) + "\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size and not _ends_with_newline(path):
            text = "\n" + text  # a line someone left unterminated stays its own line
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def latest(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The newest row (by date, then table order) of each (machine, model, mode, effort)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r.get("date") or ""):
        out[(row["machine"], row["model"], row["mode"], row["effort"])] = row
    return out
