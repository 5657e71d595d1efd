"""A run leaves nothing behind and prints nothing after its last line: every child the advisor
spawned ends by its exit handlers, not by a kill, so no named semaphore of one is left to
multiprocessing's resource tracker (which then warns, after the `Wrote ...` line, that it
cleaned up "leaked semaphore objects")."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.stopping import TimingPolicy
from advisor.stages.final_check import FreshProcess, final_check
from advisor.workload.args import make_workload
from tests._cli import advisor_cli, one_line_error
from tests.conftest import run_env

DATA = Path(__file__).parent / "data"
HOLDS = str(DATA / "holds_a_semaphore.py")
ROOT = Path(__file__).parent.parent

needs_dev_shm = pytest.mark.skipif(
    sys.platform != "linux", reason="named semaphores are files in /dev/shm on Linux"
)


def _left(log: Path) -> list[str]:
    """The named semaphores of the processes that loaded HOLDS that still exist."""
    names = log.read_text().split()
    assert names, "no process loaded the model file"
    return [n for n in names if Path("/dev/shm/sem." + n.lstrip("/")).exists()]


def _last_line_is_wrote(stderr: str, out: Path) -> None:
    """stderr ends with the `Wrote ...` line (wrapped at 160 columns off a terminal)."""
    text = "\n" + stderr.rstrip("\n")
    at = text.rfind("\nWrote ")
    last = text[at + 1 :].replace("\n", "")
    assert at >= 0 and last == f"Wrote {out} (apply with advisor.apply({str(out)!r}, model))", text[
        -1500:
    ]
    assert "leaked" not in stderr and "resource_tracker" not in stderr, stderr[-2000:]


def readme_example() -> list[str]:
    """The bundled example's command as README.md's set-up shows it, less `advisor`."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("advisor advise advisor/examples/small_cnn.py"):
            return shlex.split(line, comments=True)[1:]
    raise AssertionError("README.md shows no `advisor advise advisor/examples/small_cnn.py` line")


def _r(settings: Settings, ms: float) -> TrialResult:
    return TrialResult(settings=settings, status="ok", retimed=True,
                       measurement=Measurement(samples_ms=[ms] * 7))  # fmt: skip


@needs_dev_shm
def test_the_final_checks_process_ends_by_its_exit_handlers_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It sends its check and leaves by itself: closing it waits for that instead of killing it
    # while its exit handlers run (it was killed at once: exit code -9, its semaphore leaked).
    log = tmp_path / "semaphores.log"
    monkeypatch.setenv("SEMAPHORE_LOG", str(log))
    spare = FreshProcess(("args", {"model_file": HOLDS}))
    assert spare.ready(120) is None
    policy = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=5, max_samples=5, max_time_s=5)
    pair = [_r(Settings(), 1.0), _r(Settings(memory_format="channels_last"), 1.0)]
    check = final_check(make_workload(model_file=HOLDS), torch.device("cpu"), "infer", policy,
                        *pair, fresh=True, busy=False, timeout_s=60, spare=spare)  # fmt: skip
    assert check.where == "fresh process"
    assert spare.proc.exitcode == 0
    assert _left(log) == []


@needs_dev_shm
def test_a_cli_run_ends_with_its_wrote_line_and_leaves_no_semaphore(
    tmp_path: Path, fast_space: str
) -> None:
    # Isolated, as a user runs it: the probe's child becomes the worker, which is closed at the
    # end; every process that loaded the model file ran its exit handlers.
    log = tmp_path / "semaphores.log"
    out = tmp_path / "tuned.json"
    r = advisor_cli("advise", HOLDS, "--mode", "infer", "--device", "cpu", "--space", fast_space,
                    "--storage", "memory", "--out", str(out),
                    env={"SEMAPHORE_LOG": str(log)})  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    _last_line_is_wrote(r.stderr, out)
    assert out.exists() and _left(log) == []


@pytest.mark.slow  # the README's example at default effort: minutes on 2 cores
def test_the_readme_example_ends_with_its_wrote_line(tmp_path: Path) -> None:
    # README.md's set-up runs the bundled example (its doc-test marker: run-by this test)
    example = readme_example()
    assert "--out" not in example and "--quiet" not in example, example
    out = tmp_path / "tuned.json"
    r = advisor_cli(*example, "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    _last_line_is_wrote(r.stderr, out)
    assert out.exists()


def test_the_command_waits_for_its_threads_and_runs_its_exit_handlers_then_exits(
    tmp_path: Path,
) -> None:
    # The command leaves without the interpreter's teardown (`advisor.cli.run`), but the steps
    # before it are kept: a thread still running is waited for, every exit handler runs, and
    # the exit code is the command's. The model here is imported in the command's own process.
    model = tmp_path / "leaves_work.py"
    model.write_text(
        textwrap.dedent(f"""
        import atexit, os, threading, time
        import torch
        from torch import nn

        FOLDER = {str(tmp_path)!r}

        def _write(name):
            with open(os.path.join(FOLDER, f"{{name}}-{{os.getpid()}}"), "w") as f:
                f.write("done")

        def _late():
            time.sleep(1.0)
            _write("thread")

        threading.Thread(target=_late).start()  # not a daemon: an exit waits for it
        atexit.register(_write, "atexit")

        def build_model():
            return nn.Conv2d(3, 4, 3, padding=1)

        def example_inputs():
            return (torch.randn(1, 3, 16, 16),)
        """)
    )
    out = tmp_path / "tuned.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "advisor", "advise", str(model), "--mode", "infer", "--device",
         "cpu", "--space", str(DATA / "fast_cpu.yaml"), "--storage", "memory", "--in-process",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(), cwd=ROOT,
    )  # fmt: skip
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    _last_line_is_wrote(err, out)
    for name in ("thread", "atexit"):
        assert (tmp_path / f"{name}-{proc.pid}").read_text() == "done", name

    # A bad input's exit code survives the same exit.
    bad = advisor_cli("advise", str(tmp_path / "none.py"))
    one_line_error(bad, "model file not found")
