"""A compiled candidate whose cold compile cannot pay back is stopped before the gate's capture:
the verdict on injected measurements, the rival it is timed beside, the advice's note, the
stored result's reuse, and a real compiled dropout model stopped (or let through) in its trial."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from advisor.device.environment import current_environment
from advisor.device.global_state import global_state
from advisor.execute import gating
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement, Race
from advisor.measure.stop import Stop
from advisor.search.compile_bill import compile_note
from advisor.search.options import SearchOutcome
from advisor.space import SearchSpace, load_space
from advisor.stages.compiling import compile_race
from advisor.stages.later import reusable as _reusable
from advisor.workload.args import make_workload
from tests._cli import python_code
from tests.conftest import in_fresh_process

DATA = Path(__file__).parent / "data"
CPU = torch.device("cpu")
CL = Settings(memory_format="channels_last")


def _m(*samples: float) -> Measurement:
    return Measurement(samples_ms=list(samples))


def _r(settings: Settings, ms: float, status: str = "ok", stop: Stop | None = None) -> TrialResult:
    return TrialResult(settings=settings, status=status, stop=stop,  # type: ignore[arg-type]
                       measurement=Measurement(samples_ms=[ms] * 7, first_call_ms=50.0))  # fmt: skip


def test_the_rival_is_the_fastest_accepted_eager_candidate() -> None:
    # MobileNetV3-Small train: the per-layer combination (channels_last + 31 unfold_gemm layers,
    # 27 ms) was the fastest eager candidate, not yet re-timed; billed against channels_last
    # alone (33 ms) its 72 s compile went on to the gate and the re-time, and then did not pay.
    base, cl = _r(Settings(), 32.0), _r(CL, 33.0)
    layers = _r(CL.model_copy(update={"layers": {"features.1": "unfold_gemm"}}), 27.0)
    rejected = _r(Settings(amp="bf16"), 20.0, "rejected")
    compiled = _r(CL.model_copy(update={"compile": "default"}), 10.0)  # never its own rival
    outcome = SearchOutcome([base, cl, layers, rejected, compiled], base, [], "s",
                            current_environment(CPU), 0.0)  # fmt: skip
    space = SearchSpace(name="s", knobs={"compile": ["off", "default"]})
    race = compile_race(outcome, space.contest(steps=500))
    assert race is not None and race.horizon_steps == 500
    assert Settings.model_validate_json(race.rival or "") == layers.settings
    assert race.bar_ms == pytest.approx(27.0 * (1 + space.min_gain))
    assert compile_race(outcome, space.contest()).horizon_steps == 10_000  # type: ignore[union-attr]


def test_the_advice_says_why_the_compile_was_not_checked_and_reuses_only_its_horizon() -> None:
    stop = Contest().payback(_m(25.0, 25.1, 25.2, 25.0, 25.1), _m(28.0, 28.1, 28.2, 28.0, 28.1),
                             65.3, 0.3, "memory_format=channels_last")  # fmt: skip
    assert stop is not None
    compiled = _r(CL.model_copy(update={"compile": "default"}), 25.1, "stopped", stop)
    eager = _r(CL, 28.1)
    note = compile_note([eager, compiled], eager, eager, Contest())
    assert note is not None and "is not recommended" in note and stop.text() in note
    assert "never pays" not in note  # not the race's "slower per step" note
    # a stored verdict is reused for the same horizon, measured again for another
    assert _reusable(compiled, Race(limit_ms=1.0, horizon_steps=10_000)) is compiled
    assert _reusable(compiled, Race(limit_ms=1.0, horizon_steps=1_000_000)) is None
    ok = _r(compiled.settings, 25.1)
    assert _reusable(ok, Race(limit_ms=1.0, horizon_steps=1)) is ok


@pytest.mark.slow
def test_a_real_compile_that_cannot_pay_stops_before_the_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model with dropout, whose capture would compile it again: with a one-step horizon no
    cold compile pays, so the trial stops after its samples and the payback rounds, never
    captured, its cold compile and samples kept; PyTorch's state is as before the trial. (One
    that may pay goes on to the gate: test_compile's race tests, whose race has no rival.)"""
    workload = make_workload(model_file=str(DATA / "dropout_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.dropout

    def no_capture(*_a: object, **_k: object) -> None:
        raise AssertionError("captured a compile that cannot pay back")

    before = global_state()
    with monkeypatch.context() as m:
        m.setattr(gating, "capture", no_capture)
        race = Race(limit_ms=1e9, bar_ms=1e-6, rival=Settings().model_dump_json(),
                    horizon_steps=1)  # fmt: skip
        stopped = evaluate(workload, Settings(compile="default"), CPU, "train", space, gate,
                           race=race)  # fmt: skip
    assert stopped.status == "stopped", stopped.reason
    assert stopped.stop is not None and stopped.stop.kind == "cannot_pay"
    assert "beside default" in stopped.stop.text()
    assert stopped.compile_cold_s is not None and stopped.compile_cold_s > 0
    assert stopped.measurement is not None and len(stopped.measurement.samples_ms) >= 3
    # its payback rounds are in its record: its samples and its rival's, as many of each
    assert stopped.payback is not None and len(stopped.payback) == 2
    assert len(stopped.payback[0].samples_ms) == len(stopped.payback[1].samples_ms) >= 5
    assert stopped.rel_error is None  # not gated
    assert global_state() == before


@pytest.mark.slow  # each value a fresh process importing Inductor (2 s)
@pytest.mark.parametrize("value", [None, "0", "1"])
def test_inductors_layout_setting_is_read_without_importing_it(value: str | None) -> None:
    # The main process decides the channels_last twin without importing Inductor (Dynamo's
    # import, 1.3 s): in a fresh process, its reading agrees with Inductor's config imported after.
    code = (
        "import sys\n"
        "from advisor.stages.compiling import _layout_optimization\n"
        "ours = _layout_optimization()\n"
        "assert 'torch._inductor.config' not in sys.modules\n"
        "from torch._inductor import config\n"
        "print(ours, bool(config.layout_optimization))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_LAYOUT_OPTIMIZATION"}
    if value is not None:
        env["TORCHINDUCTOR_LAYOUT_OPTIMIZATION"] = value
    run = python_code(code, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout.split()
    assert out[0] == out[1], out
    if value is not None:
        assert out[0] == str(value == "1")


def test_a_compile_race_gets_its_allowance_from_the_rule() -> None:
    # the rule gives a compile's race its allowance: 1.6x at most on a 10 ms rival saves
    # 3.75 ms a step, 37.5 s over 10,000 steps
    race = Contest(compile_max_gain=1.6).race(_m(10.0, 10.0, 10.0), pays=True, rival="x")
    assert race is not None and race.allowance_s == pytest.approx(37.5)


@pytest.mark.slow  # two cold compiles of a small CNN, in a fresh process
def test_a_real_cold_compile_past_its_allowance_stops_and_the_next_one_compiles() -> None:
    # In a fresh process, as a worker runs it: stopped mid-compile, PyTorch's state as before,
    # and the next compile in the same process runs to its end. A crash fails this test alone,
    # with the stack faulthandler prints, not the test runner's process.
    in_fresh_process(stop_a_cold_compile)


def stop_a_cold_compile() -> None:
    """The body of the test above."""
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "infer", space)
    race = Race(limit_ms=1e9, bar_ms=1e9, rival=Settings().model_dump_json(), horizon_steps=1000,
                allowance_s=0.05)  # fmt: skip
    before = global_state()
    stopped = evaluate(workload, Settings(compile="default"), CPU, "infer", space, gate, race=race)
    assert stopped.status == "stopped" and stopped.stop is not None, stopped.reason
    assert stopped.stop.kind == "cannot_pay" and stopped.stop.rival is None
    assert stopped.measurement is None and stopped.compile_cold_s is not None
    assert stopped.compile_cold_s >= 0.05 and "of compiling" in (stopped.reason or "")
    assert global_state() == before
    free = Race(limit_ms=1e9, bar_ms=1e9)
    done = evaluate(workload, Settings(compile="default"), CPU, "infer", space, gate, race=free)
    assert done.status == "ok" and done.compile_cold_s is not None, done.reason


@pytest.mark.slow  # a worker's start, Inductor's and a stopped cold compile (about 10 s)
def test_a_worker_whose_compile_was_stopped_is_asked_to_leave_not_killed() -> None:
    # A killed worker's named semaphores (tqdm's lock, made while Inductor compiles) would stay
    # registered with the resource tracker, which warns of them when the command exits.
    from advisor.execute.isolate import IsolatedEvaluator

    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    ev = IsolatedEvaluator(workload.info, CPU, "infer", space, timeout_s=120.0)
    try:
        assert ev(Settings()).status == "ok"
        worker = ev._proc
        assert worker is not None
        race = Race(limit_ms=1e9, bar_ms=1e9, rival=Settings().model_dump_json(),
                    horizon_steps=1000, allowance_s=0.05)  # fmt: skip
        stopped = ev(Settings(compile="default"), race=race)
        assert stopped.stop is not None and stopped.stop.kind == "cannot_pay", stopped.reason
        assert stopped.stop.rival is None  # stopped mid-compile
        assert worker.exitcode == 0  # it left (its exit handlers ran); a kill reads -9
        assert ev(Settings()).status == "ok"  # a fresh worker goes on
    finally:
        ev.close()
