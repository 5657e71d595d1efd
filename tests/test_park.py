"""A screened candidate is kept built and warm for its full timing (advisor.execute.park): the
full timing resumes it, gates the same numbers as a fresh build, and keeps the screen apart."""

from __future__ import annotations

from pathlib import Path

import torch

from advisor.execute.evaluators import InProcessEvaluator
from advisor.execute.park import CPU_BYTES, Park, Parked, cpu_budget
from advisor.knobs import GlobalFlags, Settings
from advisor.measure.candidate import Candidate
from advisor.measure.stats import Measurement, Race
from advisor.space import load_space
from advisor.stages.walltime import timed_by_stage
from advisor.workload.args import make_workload

DATA = Path(__file__).parent / "data"
CPU = torch.device("cpu")
CL = Settings(memory_format="channels_last")


def _evaluator(mode: str = "train") -> InProcessEvaluator:
    space = load_space(str(DATA / "grid8_cpu.yaml"), CPU).model_copy(update={"race": True})
    wl = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    return InProcessEvaluator(wl, CPU, mode, space)  # type: ignore[arg-type]


def test_a_survivor_is_timed_on_the_candidate_its_screen_built() -> None:
    ev = _evaluator()
    screened = ev(CL, race=Race(float("inf"), screen=3))
    assert screened.status == "stopped" and screened.measurement is not None
    assert len(screened.measurement.samples_ms) == 3
    assert ev._park.held_bytes > 0
    full = ev(CL)
    assert ev._park.held_bytes == 0  # taken once
    assert full.status == "ok" and full.screen == screened.measurement
    m = full.measurement
    assert m is not None and len(m.samples_ms) >= 3
    # no second first call: the screen's is the candidate's; one re-warming call more
    assert m.first_call_ms == screened.measurement.first_call_ms
    assert m.warmup_runs == screened.measurement.warmup_runs + 1
    # the screen's samples are the run's too, kept apart from the full timing's
    assert sum(timed_by_stage([full]).values()) == sum(m.samples_ms) * m.reps / 1e3 + sum(
        screened.measurement.samples_ms
    ) * screened.measurement.reps / 1e3
    # the gate saw what a fresh build gives: its steps moved no weight, its buffers are reset
    fresh = _evaluator()(CL)
    assert fresh.screen is None
    assert full.rel_error == fresh.rel_error and full.grad_error == fresh.grad_error
    assert full.layer_error == fresh.layer_error


def test_the_park_empties_when_the_survivors_were_timed() -> None:
    ev = _evaluator("infer")
    ev(CL, race=Race(float("inf"), screen=3))
    ev(Settings(), race=Race(float("inf"), screen=3))
    assert ev._park.held_bytes > 0
    ev.retime([])  # the re-time comes after the stage's full timings
    assert ev._park.held_bytes == 0
    again = ev(CL)
    assert again.screen is None and again.status == "ok"  # built afresh
    ev(CL, race=Race(float("inf"), screen=3))
    ev.close()
    assert ev._park.held_bytes == 0


def _parked(settings: Settings) -> Parked:
    wl = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    cand = Candidate(wl, settings, CPU, "train")
    cand.step()
    return Parked(cand, Measurement(samples_ms=[1.0, 1.0, 1.0]), 0.0, 0.0)


def test_what_is_not_parked_and_the_flags_a_parked_candidate_runs_with() -> None:
    before = GlobalFlags.read()
    assert not _keeps(Park(torch.device("cuda")), CL)  # GPU memory is the timed ones'
    assert not _keeps(Park(CPU), Settings(compile="default"))
    assert not _keeps(Park(CPU, budget_bytes=1000), CL)  # over its budget
    assert 0 < Park(CPU).budget <= CPU_BYTES and 0 < cpu_budget() <= CPU_BYTES  # what is free
    park = Park(CPU)
    fp32_bf16 = Settings(cpu_fp32="bf16")
    kept = _parked(fp32_bf16)
    assert park.keep(fp32_bf16, kept)
    assert not _keeps(park, fp32_bf16)  # one per settings
    assert GlobalFlags.read() == before  # parked: its flags put back
    assert park.take(CL) is None
    got = park.take(fp32_bf16)
    assert got is kept
    assert GlobalFlags.read() == {**before, **_flags_of(fp32_bf16)}  # taken: its own again
    got.cand.close()
    assert GlobalFlags.read() == before


def _keeps(park: Park, settings: Settings) -> bool:
    """Whether `park` keeps a candidate with these settings (one it refuses is closed, as the
    runner closes it)."""
    parked = _parked(settings)
    if park.keep(settings, parked):
        return True
    parked.cand.close()
    return False


def _flags_of(settings: Settings) -> dict:
    flags = GlobalFlags()
    flags.apply(settings, CPU)
    try:
        return GlobalFlags.read()
    finally:
        flags.restore()
