"""The final check: a change is recommended only if it holds against PyTorch's default where
the user runs it (a fresh process built as `advisor.apply` builds it). Timings are controlled
with sleeps (tests/data/wins_when_worn.py: channels_last 5 ms against 50 ms, only in a process
that built the model four times or more)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

import advisor
from advisor.advice import build_advice
from advisor.config import FinalCheck
from advisor.device.environment import current_environment
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.timing import TimingPolicy
from advisor.search import SearchOutcome
from advisor.stages.final_check import CheckFailed, FreshProcess, check_policy, final_check
from advisor.workload.args import make_workload

DATA = Path(__file__).parent / "data"
WORN = str(DATA / "wins_when_worn.py")
CPU = torch.device("cpu")
CL = Settings(memory_format="channels_last")
POLICY = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=9, max_samples=9, max_time_s=5)


def _r(settings: Settings, ms: float) -> TrialResult:
    return TrialResult(settings=settings, status="ok", retimed=True,
                       measurement=Measurement(samples_ms=[ms] * 7))  # fmt: skip


def test_the_check_policy_keeps_enough_rounds_for_a_paired_interval() -> None:
    cut = check_policy(POLICY, time_left_s=0.0)  # no budget left: the check still runs
    assert cut.min_samples >= 5 and cut.max_time_s == pytest.approx(0.05)
    assert check_policy(POLICY, None) == dataclasses.replace(POLICY, min_samples=7)


@pytest.mark.slow
def test_a_win_of_a_worn_process_does_not_hold_in_a_fresh_one() -> None:
    workload = make_workload(model_file=WORN)
    for _ in range(3):
        workload.make_model()  # this process is worn: here channels_last takes 5 ms, not 50
    pair = [_r(Settings(), 50.0), _r(CL, 5.0)]
    here = final_check(workload, CPU, "infer", POLICY, *pair, fresh=False, busy=False,
                       timeout_s=120)  # fmt: skip
    assert here.where == "this process" and here.held, here  # 10x by its sleeps
    assert here.rounds == 9 and here.one_thread is None  # not busy: no one-thread check
    fresh = final_check(workload, CPU, "infer", POLICY, *pair, fresh=True, busy=False,
                        timeout_s=120)  # fmt: skip
    assert fresh.where == "fresh process" and not fresh.held, fresh
    assert fresh.speedup_ci[0] <= 1.0 and fresh.first_call_s is not None


@pytest.mark.slow
def test_an_isolated_run_keeps_the_default_when_the_win_does_not_carry_over(
    tmp_path: Path,
) -> None:
    space = tmp_path / "mf.yaml"
    space.write_text(
        "name: mf\ndevice: cpu\nknobs: {memory_format: [contiguous, channels_last]}\n"
        "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 7, max_samples: 9, max_time_s: 1}\n"
        "per_layer: false\nrace: false\n"
    )
    advice = advisor.advise(model_file=WORN, mode="infer", device="cpu", space=str(space),
                            isolate=True)  # fmt: skip
    rows = {r.settings.label(): r for r in advice.results}
    # the worker built the model for the reference and each trial: channels_last won there
    assert rows["memory_format=channels_last"].median_ms < 0.75 * advice.baseline.median_ms
    result = advice.config.result
    assert result is not None and result.final_check is not None
    assert result.final_check.where == "fresh process" and not result.final_check.held
    assert advice.settings == Settings()
    assert "did not hold in the final check in a fresh process" in result.why, result.why


def _outcome(results: list[TrialResult]) -> SearchOutcome:
    return SearchOutcome(results, results[0], [], "s", current_environment(CPU), 0.0)


def _check(held: bool, one_thread: tuple[float, float, float] | None = None) -> FinalCheck:
    ci = (1.2, 1.4) if held else (0.8, 1.3)
    return FinalCheck(where="fresh process", speedup=1.3, speedup_ci=ci, rounds=9, held=held,
                      one_thread=one_thread)  # fmt: skip


def test_the_advice_follows_the_final_check() -> None:
    info = make_workload(model_file=str(DATA / "tiny_cnn.py")).info
    results = [_r(Settings(), 20.0), _r(CL, 10.0)]
    held = build_advice(_outcome(results), info, "infer", "s", final=_check(True))
    assert held.settings == CL and "it held in the final check" in held.config.result.why
    assert held.config.result.final_check == _check(True)
    busy = _check(False, one_thread=(0.97, 0.9, 1.05))
    kept = build_advice(_outcome(results), info, "infer", "s", final=busy)
    why = kept.config.result.why
    assert kept.settings == Settings() and "did not hold" in why and "one thread 0.97x" in why
    failed = build_advice(_outcome(results), info, "infer", "s", final_error="it crashed")
    assert (
        failed.settings == Settings()
        and "could not be made (it crashed)" in failed.config.result.why
    )


@pytest.mark.slow
def test_the_fresh_check_on_cuda_makes_the_device_current_and_times_with_events(
    cuda_standin: Path,
) -> None:
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    pair = [_r(Settings(), 1.0), _r(CL, 1.0)]
    check = final_check(workload, torch.device("cuda"), "infer", POLICY, *pair, fresh=True,
                        busy=True, timeout_s=120)  # fmt: skip
    assert check.where == "fresh process" and check.rounds == 9
    assert check.one_thread is None  # threads do not decide a GPU's time
    log = [json.loads(line) for line in cuda_standin.read_text().splitlines()]
    child = {e["pid"] for e in log if e["call"] == "set_device"}
    assert len(child) == 1 and child <= {e["pid"] for e in log if e["call"] == "event"}


@pytest.mark.slow
def test_a_process_started_early_makes_the_check_as_a_fresh_one_would() -> None:
    # Started beside the probe, it loads the model file and waits: it is still a fresh process
    # (here channels_last is no faster: the model was built fewer than four times in it).
    spare = FreshProcess(("args", {"model_file": WORN}))
    try:
        assert spare.ready(120) is None
        workload = make_workload(model_file=WORN)
        pair = [_r(Settings(), 50.0), _r(CL, 5.0)]
        check = final_check(workload, CPU, "infer", POLICY, *pair, fresh=True, busy=False,
                            timeout_s=120, spare=spare)  # fmt: skip
        assert check.where == "fresh process" and not check.held, check
        assert not spare.proc.is_alive()  # used once, then ended
    finally:
        spare.close()


def test_a_spare_loads_the_workload_it_is_sent_when_it_loaded_another() -> None:
    spare = FreshProcess(("args", {"model_file": str(DATA / "tiny_cnn.py")}))
    try:
        assert spare.ready(120) is None
        info = make_workload(model_file=str(DATA / "tiny_cnn.py")).info
        other = info.model_copy(update={"target": str(DATA / "no_such_model.py")})
        with pytest.raises(CheckFailed, match="model file not found: .*no_such_model.py"):
            spare.check(other.model_dump_json(), CPU, "infer",
                        [_r(Settings(), 1.0), _r(CL, 1.0)], POLICY, False, 60)  # fmt: skip
    finally:
        spare.close()


def test_a_spare_that_failed_to_load_is_replaced_by_a_process_of_the_checks_own() -> None:
    spare = FreshProcess(("args", {"model_file": str(DATA / "no_such_model.py")}))
    why = spare.ready(120)
    assert why is not None and why.startswith("loading the workload failed: model file not found")
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    pair = [_r(Settings(), 1.0), _r(CL, 1.0)]
    check = final_check(workload, CPU, "infer", POLICY, *pair, fresh=True, busy=False,
                        timeout_s=120, spare=spare)  # fmt: skip
    assert check.where == "fresh process" and check.rounds == 9
    spare.close()


def test_a_spare_whose_load_hangs_is_killed_not_waited_for(tmp_path: Path) -> None:
    hangs = tmp_path / "hangs.py"
    hangs.write_text("import time\ntime.sleep(600)\n")
    spare = FreshProcess(("args", {"model_file": str(hangs)}))
    assert spare.ready(1.0) == "loading"  # still loading: the run goes on without it
    start = time.monotonic()
    spare.close()
    assert time.monotonic() - start < 5 and not spare.proc.is_alive()
