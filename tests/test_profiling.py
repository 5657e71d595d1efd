"""`$ADVISOR_PROFILE_DIR`: every advisor process leaves a cProfile (advisor/execute/profiling.py),
also a child its parent ends, and `python -m benchmarks profile` (benchmarks/studies.py) tables
them. Real processes, real
runs: nothing of the measurement is mocked."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pstats
import signal
import subprocess
import sys
import tarfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from advisor.execute import children, profiling
from advisor.execute.worker_process import leave
from tests._cli import advisor_cli
from tests.conftest import DATA, run_env

ROOT = Path(__file__).resolve().parent.parent
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM and /proc: POSIX")
# The CLI run's space: two memory formats, short timing, no precision to judge by training
SPACE = """schema_version: 1
name: profiling_test_cpu
description: test_profiling's CLI run
device: cpu
knobs:
  memory_format: [contiguous, channels_last]
  conv_impl: [native]
budget: {trials: 2, time_s: 60}
timing: {warmup_runs: 1, warmup_s: 0.0, min_samples: 5, max_samples: 20, target_rel_ci: 0.05,
         max_time_s: 0.1}
per_layer: false
race: false
"""


def _summary(folder: Path) -> str:
    from benchmarks.__main__ import run

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(["profile", str(folder), "--top", "5"]) == 0
    return out.getvalue()


def _profile(folder: Path, role: str, pid: int) -> tuple[dict[str, Any], set[str]]:
    """A process's sidecar and the names of the functions its profile saw (pstats loads it)."""
    meta = json.loads((folder / f"{role}-{pid}.json").read_text())
    stats = pstats.Stats(str(folder / f"{role}-{pid}.prof"))
    return meta, {name for (_, _, name) in stats.stats}  # type: ignore[attr-defined]


# ------------------------------------------------------------------ children's targets


def _wait_to_be_ended(conn: Connection) -> None:
    """Say who it is and whether profiling changed its SIGTERM, then wait until ended."""
    conn.send((os.getpid(), "cProfile" in sys.modules, signal.getsignal(signal.SIGTERM)))
    conn.recv()  # its parent ends it instead of answering


def _leave_when_told(conn: Connection) -> None:
    conn.send((os.getpid(), None, None))
    conn.recv()
    leave()  # as a worker told to end leaves: exit handlers, then os._exit


def _start(target: Any, role: str) -> tuple[Any, Connection, int, Any]:
    proc, conn = children.start_child(target, role=role)
    assert conn.poll(120), "the child did not answer"
    pid, imported, handler = conn.recv()
    return proc, conn, pid, (imported, handler)


@posix_only
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_child_its_parent_ends_still_leaves_its_profile(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(profiling.ENV, str(tmp_path))
    monkeypatch.setenv(children.METHOD_ENV, method)  # forkserver: where Linux has it
    proc, conn, pid, _ = _start(_wait_to_be_ended, "ended_child")
    profiling.kill(proc)  # how a parent ends a child (isolate, probe, final_check): SIGKILL ...
    proc.join(30)
    conn.close()
    # ... after a SIGTERM while profiling: the child wrote its profile, then died of the signal
    assert proc.exitcode == -signal.SIGTERM
    meta, names = _profile(tmp_path, "ended_child", pid)
    assert meta["ended"] == "SIGTERM" and meta["pid"] == pid and meta["covered_s"] > 0
    assert "_wait_to_be_ended" in names  # still on its stack when it was ended


@posix_only
def test_a_child_that_leaves_by_its_exit_handlers_leaves_its_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(profiling.ENV, str(tmp_path))
    proc, conn, pid, _ = _start(_leave_when_told, "leaving_child")
    conn.send(None)
    proc.join(30)
    conn.close()
    assert proc.exitcode == 0
    meta, names = _profile(tmp_path, "leaving_child", pid)
    assert meta["ended"] == "exit" and "leave" in names


@posix_only
def test_without_the_variable_a_child_is_started_and_ended_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(profiling.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    proc, conn, _, (imported, handler) = _start(_wait_to_be_ended, "unprofiled")
    assert handler == signal.SIG_DFL  # no handler of ours ...
    assert not imported  # ... and no cProfile, in a child of the fork server or a spawned one
    profiling.kill(proc)
    proc.join(30)
    conn.close()
    assert proc.exitcode == -signal.SIGKILL  # killed at once, as before
    assert list(tmp_path.iterdir()) == []


def test_a_program_that_imports_the_advisor_is_not_profiled(tmp_path: Path) -> None:
    # Only the `advisor` command is: a training script's `import advisor` pays nothing for it.
    code = "import sys, advisor; print('cProfile' in sys.modules)"
    env = {**run_env(), profiling.ENV: str(tmp_path / "prof")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False" and not (tmp_path / "prof").exists()


# ------------------------------------------------------------------ a whole advise run


@posix_only
def test_an_advise_run_profiles_the_command_and_its_workers_and_the_summary_names_them(
    tmp_path: Path,
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    prof = tmp_path / "prof"
    out = tmp_path / "tuned.json"
    r = advisor_cli("advise", "advisor/examples/small_cnn.py", "--mode", "train", "--device",
                    "cpu", "--effort", "quick", "--space", str(space), "--storage", "memory",
                    "--out", str(out), env={profiling.ENV: str(prof)})  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.exists() and "not written" not in r.stderr  # every profile was written
    found = {}
    for side in prof.glob("*.json"):
        meta = json.loads(side.read_text())
        found[meta["role"]] = meta
        assert (prof / f"{meta['role']}-{meta['pid']}.prof").exists()
    assert "advisor" in found, sorted(found)
    workers = [role for role in found if "worker" in role]
    assert workers, sorted(found)
    command, names = _profile(prof, "advisor", found["advisor"]["pid"])
    # From the package's first import: torch's import and the run itself are in its profile
    assert {"run_advise", "cmd_advise"} <= names and "_find_and_load" in names
    assert command["ended"] == "exit" and 0 <= command["age_at_start_s"] < 60
    assert command["covered_s"] > 1
    for role in workers:
        meta, names = _profile(prof, role, found[role]["pid"])
        assert "worker_main" in names and meta["ended"] == "exit"
    if "forkserver" in found:  # Linux: the server's preload, ended before its first fork
        assert found["forkserver"]["ended"] == "preload done"

    text = _summary(prof)
    assert "| process | pid |" in text and f"all ({len(found)} processes)" in text
    for role, meta in found.items():
        assert f"| {role} | {meta['pid']} |" in text
        assert f"### {role} (pid {meta['pid']})" in text
    assert "Top 5 by cumulative time" in text and "Top 5 by own time" in text
    assert "`advisor/cli.py:" in text  # the command, by its functions, in its own tables


@posix_only
@pytest.mark.slow  # a second advise run, through the GPU command on the CPU (about 10 s)
def test_the_gpu_commands_profile_option_brings_back_tables_and_one_archive(
    tmp_path: Path,
) -> None:
    from benchmarks.__main__ import run

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "out"
    argv = ["gpu", "--device", "cpu", "--model-file", str(DATA / "tiny_cnn.py"), "--efforts",
            "quick", "--space", str(space), "--no-retime", "--profile", "--deadline-s", "100",
            "--out-dir", str(out)]  # fmt: skip
    assert run(argv) == 0
    (row,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert row["status"] == "ok" and row["profile"] == "tiny_cnn_train_quick"
    text = (out / "gpu_profile.md").read_text()
    assert "## tiny_cnn_train_quick" in text and "### advisor (pid " in text and "worker" in text
    with tarfile.open(out / "gpu_profiles.tgz") as tar:
        names = tar.getnames()
    assert any(n.startswith("tiny_cnn_train_quick/advisor-") and n.endswith(".prof") for n in names)
    # Few files come back from the device tool: the profiles add two, whatever the processes
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "runs.jsonl", f"{row['machine']}.md", "gpu_profile.md", "gpu_profiles.tgz"])  # fmt: skip
