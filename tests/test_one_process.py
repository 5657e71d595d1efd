"""An isolated run starts one process for the user's code: the probe's child, which ran the model
once, goes on as the worker for the trials, the layer groups, the combination and the re-times."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import advisor
from advisor.device.global_state import global_state, restore_global_state
from advisor.execute.evaluators import InProcessEvaluator, Lent
from advisor.execute.isolate import IsolatedEvaluator
from advisor.execute.probe import probe_model
from advisor.knobs import Settings
from advisor.space import SearchSpace
from advisor.stages.layer_groups import layer_groups
from advisor.workload.build import model_workload
from tests.conftest import DATA, run_env

CPU = torch.device("cpu")
SPACE = str(DATA / "per_layer_cpu.yaml")
QUICK = SearchSpace(
    name="t", knobs={}, timing={"min_samples": 3, "max_time_s": 0.1, "warmup_s": 0.0}
)
# A fixed number of runs per candidate: the forwards counted tell a candidate from a reference.
# Counted runs: 3 samples, and a warm-up of its configured runs only (a time cap of nothing
# leaves no time to the rule that warms a step up until it settles: `settle.settling`).
FIXED = SearchSpace(
    name="t",
    knobs={},
    timing={"min_samples": 3, "max_samples": 3, "max_time_s": 1e-9, "warmup_s": 0.0,
            "warmup_runs": 1},
)  # fmt: skip
PID_NET = (
    "import os, torch\nfrom torch import nn\n"
    "torch.set_num_threads(1)  # at import: must not reach the trials\n"
    "class Net(nn.Sequential):\n"
    "    def forward(self, x):\n"
    "        with open(os.environ['PID_LOG'], 'a') as f:\n"
    "            f.write(f'{os.getpid()} {torch.get_num_threads()} {x.dtype}\\n')\n"
    "        return super().forward(x)\n"
    "def build_model():\n"
    "    return Net(nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1)), nn.ReLU(),\n"
    "               nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1)))\n"
    "def example_inputs():\n    return (torch.randn(1, 4, 4, 12, 12),)\n"
)


@pytest.fixture
def pid_net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    path, log = tmp_path / "net.py", tmp_path / "pids.log"
    path.write_text(PID_NET)
    monkeypatch.setenv("PID_LOG", str(log))
    # Tests that load the model here import it in this process, and it sets the thread count at
    # import (as `advise` would undo): undo it too, or every later test runs on one thread.
    saved = global_state()
    yield path, log
    restore_global_state(saved)


def _forwards(log: Path) -> list[tuple[int, int, str]]:
    """(pid, threads, input dtype) of each forward of the model."""
    rows = (line.split() for line in log.read_text().splitlines())
    return [(int(p), int(t), d) for p, t, d in rows]


def test_every_stage_runs_in_the_probes_child(
    pid_net: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = pid_net
    started: list[int] = []
    fresh_start = IsolatedEvaluator._start

    def counted(self: IsolatedEvaluator) -> str | None:
        started.append(1)
        return fresh_start(self)

    monkeypatch.setattr(IsolatedEvaluator, "_start", counted)
    threads = torch.get_num_threads()
    advice = advisor.advise(
        model_file=str(path), mode="train", device="cpu", space=SPACE, isolate=True
    )
    assert torch.get_num_threads() == threads  # the file was imported here too: put back
    assert started == [], "a fresh worker was started: the probe's child should serve the run"
    layers = advice.layer_trials
    assert set(layers[layers["status"] == "ok"]["impl"]) >= {"native", "unfold_gemm"}
    forwards = _forwards(log)
    assert multiprocessing.active_children() == []  # every process the run started has ended
    # Two children: the probe's, which goes on as the worker for every model trial, and the
    # final check's fresh process, which loads the model file beside the probe (one forward,
    # the file's own check) and runs nothing else until the check, if a change is picked (on a
    # busy machine one can be), once the run's worker is done.
    result = advice.config.result
    check = result.final_check if result is not None else None
    fresh_check = check is not None and check.where == "fresh process"
    counts = Counter(pid for pid, _, _ in forwards if pid != os.getpid())
    assert len(counts) == 2, counts
    runs = {p: [i for i, (pid, _, _) in enumerate(forwards) if pid == p] for p in counts}

    def spare_like(p: int, q: int) -> bool:  # every forward of p's but its load after q's last
        return all(i > max(runs[q]) for i in runs[p][1:])

    # Told apart by order, not by count: on a busy machine the check's process (which also
    # times at one thread there) can run more forwards than a worker whose rivals raced out.
    pairs = [(p, q) for p, q in (tuple(counts), tuple(counts)[::-1]) if spare_like(p, q)]
    assert pairs, runs
    spare, worker = min(pairs, key=lambda pq: len(runs[pq[0]]))
    spare_runs = runs[spare]
    last_of_worker = max(runs[worker])
    first_trial = [(pid, t) for pid, t, _ in forwards].index((worker, threads))
    assert spare_runs[0] < first_trial  # it loaded before anything was timed ...
    assert all(i > last_of_worker for i in spare_runs[1:])  # ... and ran nothing else before
    assert len(spare_runs) > 1 if fresh_check else len(spare_runs) == 1, (spare_runs, check)
    # The model's import set one thread: the probe's step and the model's own check after its
    # import run so; the trials start from the state found before any user code ran, as a
    # fresh worker's do.
    threads_seen = [t for pid, t, _ in forwards if pid == worker]
    assert threads_seen[0] == 1
    trials = threads_seen[threads_seen.index(threads) :]
    assert len(trials) >= 5 and set(trials) == {threads}  # at least the default's samples


@pytest.mark.slow  # three probe children and their workers (8 s)
def test_a_kept_probe_child_serves_or_is_replaced(pid_net: tuple[Path, Path]) -> None:
    path, _ = pid_net
    wl = model_workload(str(path))
    probed = probe_model({"model_file": str(path)}, "infer", "cpu", 60.0, keep=True)
    assert probed is not None and probed.proc.is_alive()
    ev = IsolatedEvaluator(wl.info, CPU, "infer", QUICK, timeout_s=60.0)
    try:
        ev.adopt(probed.proc, probed.conn)
        assert ev(Settings()).status == "ok"
        assert ev.pid == probed.proc.pid and ev.starts == 1
    finally:
        ev.close()
    assert not probed.proc.is_alive()
    # One that dies before it serves is replaced by a fresh worker, and the trial still runs.
    probed = probe_model({"model_file": str(path)}, "infer", "cpu", 60.0, keep=True)
    assert probed is not None
    probed.proc.kill()
    probed.proc.join()
    ev = IsolatedEvaluator(wl.info, CPU, "infer", QUICK, timeout_s=60.0)
    try:
        ev.adopt(probed.proc, probed.conn)
        assert ev(Settings()).status == "ok"
        assert ev.pid != probed.proc.pid and ev.starts == 1
    finally:
        ev.close()
    # Not adopted: closing it ends the child.
    probed = probe_model({"model_file": str(path)}, "infer", "cpu", 60.0, keep=True)
    assert probed is not None
    probed.close()
    assert probed.proc.exitcode == 0


# isolated: a worker (3 s), in the slow run; the probe child serves as one in the test above
@pytest.mark.parametrize(
    "isolated", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in process", "isolated"]
)
def test_a_lent_evaluator_goes_back_to_the_model(
    pid_net: tuple[Path, Path], isolated: bool
) -> None:
    """The per-layer stage borrows the run's evaluator; closing the loan switches it back to the
    model, whose references were kept (not rebuilt), and the evaluator stays open."""
    path, log = pid_net
    wl = model_workload(str(path))
    ev = (
        IsolatedEvaluator(wl.info, CPU, "infer", FIXED, timeout_s=60.0)
        if isolated
        else InProcessEvaluator(wl, CPU, "infer", FIXED)
    )

    def forwards_of(settings: Settings) -> int:
        log.unlink(missing_ok=True)
        assert ev(settings).status == "ok"
        return len(_forwards(log)) if log.exists() else 0

    try:
        first = forwards_of(Settings())  # the gate's fp32 reference, then the candidate
        alone = forwards_of(Settings())  # the candidate alone
        assert first > alone > 0
        group = layer_groups(wl, Settings(), CPU)[0]
        lent = Lent(ev, group.workload, home=wl)
        log.unlink()
        assert lent(Settings(conv_impl="unfold_gemm")).status == "ok"
        assert not log.exists()  # a layer alone: the model's forward did not run
        lent.close()
        # back on the model with its references kept: the candidate's runs, no reference run
        assert forwards_of(Settings()) == alone
    finally:
        ev.close()


@pytest.mark.slow  # an advisor worker process and its probe (6 s)
def test_advisor_worker_runs_the_model_in_the_probes_child(
    pid_net: tuple[Path, Path], tmp_path: Path
) -> None:
    path, log = pid_net
    store = f"sqlite:///{tmp_path / 'studies.db'}"
    r = subprocess.Popen(
        [sys.executable, "-m", "advisor", "worker", str(path), "--device", "cpu",
         "--space", str(DATA / "fast_cpu.yaml"), "--storage", store],
        env={**run_env(), "PID_LOG": str(log)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = r.communicate(timeout=300)
    assert r.returncode == 0, stderr
    assert "points done" in stdout
    children = {pid for pid, _, _ in _forwards(log)} - {r.pid}
    assert len(children) == 1  # the probe's step and every trial


# A model whose load takes seconds (a heavy import, as MONAI's 5 s): the advise process then
# waits as long again for its own load, and the probe's child, kept as the worker, fills that
# wait with Inductor's start.
SLOW_LOAD_NET = (
    "import time, torch\nfrom torch import nn\n"
    "def build_model():\n"
    "    time.sleep(1.2)\n"
    "    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())\n"
    "def example_inputs():\n    return (torch.randn(2, 3, 8, 8),)\n"
)


@pytest.mark.slow
def test_a_probe_childs_compiled_trial_pays_inductors_start(tmp_path: Path) -> None:
    """The advise process no longer loads a model file at start-up (the probe's child describes
    it: advisor.workload.deferred), so there is no wait for the child to hide Inductor's start
    in: the first compiled trial pays it, shown apart ("compile: Inductor start"), and the eager
    stages before it are not delayed by it."""
    path = tmp_path / "slow_load.py"
    path.write_text(SLOW_LOAD_NET)
    probed = probe_model({"model_file": str(path)}, "infer", "cpu", 120.0, keep=True)
    assert probed is not None
    workload = probed.deferred()
    assert workload is not None
    ev = IsolatedEvaluator(workload.info, CPU, "infer", QUICK, timeout_s=120.0)
    try:
        ev.adopt(probed.proc, probed.conn)
        assert ev(Settings()).status == "ok"
        result = ev(Settings(compile="default"))
        assert result.status == "ok", result.reason
        assert ev.pid == probed.proc.pid
        assert result.compile_start_s is not None and result.compile_start_s > 0
        assert result.compile_cold_s is not None and result.compile_cold_s > 0
    finally:
        ev.close()
    assert workload.load_s is None  # nothing here needed the model


# A model file that leaves a mark at exit: the user's own exit handler (and ours) still runs
# when a child ends without the interpreter's teardown.
ATEXIT_NET = (
    "import atexit, os, torch\nfrom torch import nn\n"
    "MARK = os.environ['EXIT_MARK']\n"
    "atexit.register(lambda: open(MARK, 'a').write(f'{os.getpid()}\\n'))\n"
    "def build_model():\n    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())\n"
    "def example_inputs():\n    return (torch.randn(2, 3, 8, 8),)\n"
)


def test_a_closed_worker_and_check_process_leave_by_their_exit_handlers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.stages.final_check import FreshProcess

    path, mark = tmp_path / "net.py", tmp_path / "exits.log"
    path.write_text(ATEXIT_NET)
    monkeypatch.setenv("EXIT_MARK", str(mark))
    wl = model_workload(str(path))
    ev = IsolatedEvaluator(wl.info, CPU, "infer", QUICK, timeout_s=60.0)
    assert ev(Settings()).status == "ok"
    worker, proc = ev.pid, ev._proc
    ev.close()
    fresh = FreshProcess(("args", {"model_file": str(path)}))
    assert fresh.ready(120.0) is None
    fresh.close()
    assert proc is not None and proc.exitcode == 0 and fresh.proc.exitcode == 0  # not killed
    ended = {int(pid) for pid in mark.read_text().split()}
    assert ended == {worker, fresh.proc.pid}
