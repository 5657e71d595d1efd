"""A compiled candidate under dropout is measured without the gate's capture (a second cold
compile) and gated only once it wins the pick (advisor.stages.gate_winner)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import advisor
from advisor.device.environment import current_environment
from advisor.execute.gating import gate_only, settle
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement, Race
from advisor.measure.verdict import GATE_PENDING
from advisor.search import SearchOutcome
from advisor.space import SearchSpace, load_space
from advisor.stages.compiling import compile_race
from advisor.stages.gate_winner import gate_the_pick
from advisor.workload.args import make_workload

DATA = Path(__file__).parent / "data"
CPU = torch.device("cpu")
COMPILED = Settings(compile="default")


def _r(settings: Settings, ms: float, **kw: object) -> TrialResult:
    return TrialResult(settings=settings, status="ok", retimed=True,
                       measurement=Measurement(samples_ms=[ms] * 7, first_call_ms=1.0),
                       **kw)  # type: ignore[arg-type]  # fmt: skip


class Verdicts:
    """An evaluator whose gate answers from a table (what the worker's gate said), recording
    which candidates it was asked to gate. The pick's control flow is what is tested here."""

    def __init__(self, verdicts: list[TrialResult]) -> None:
        self.verdicts = {v.settings.label(): v for v in verdicts}
        self.asked: list[str] = []

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        self.asked.append(settings.label())
        return self.verdicts[settings.label()]


def _outcome(results: list[TrialResult]) -> SearchOutcome:
    return SearchOutcome(results, results[0], [], "gate-winner", current_environment(CPU), 0.0)


def test_the_compile_stage_races_with_the_gate_deferred() -> None:
    base, cl = _r(Settings(), 10.0), _r(Settings(memory_format="channels_last"), 8.0)
    space = SearchSpace(name="s", knobs={"compile": ["off", "default"]})
    race = compile_race(_outcome([base, cl]), space)
    assert race is not None and race.defer_gate


def test_a_pending_pick_is_gated_and_kept_when_accepted() -> None:
    base = _r(Settings(), 10.0)
    pending = _r(COMPILED, 2.0, compile_cold_s=0.1, gate_pending=True, reason=GATE_PENDING)
    ok = TrialResult(settings=COMPILED, status="ok", rel_error=1e-6, grad_error=1e-5,
                     tolerance=1e-3, compile_check_s=0.2, gate_s=0.3)  # fmt: skip
    outcome = _outcome([base, pending])
    ev = Verdicts([ok])
    gated = gate_the_pick(outcome, ev, 0.02, None, "memory")  # type: ignore[arg-type]
    assert ev.asked == [COMPILED.label()] and len(gated) == 1
    now = next(r for r in outcome.results if r.settings == COMPILED)
    assert now.status == "ok" and not now.gate_pending and now.rel_error == 1e-6
    assert now.measurement == pending.measurement and now.compile_cold_s == 0.1  # the trial's
    assert now.compile_check_s == 0.2 and now.reason is None
    assert gate_the_pick(outcome, ev, 0.02, None, "memory") == []  # gated once  # type: ignore[arg-type]


@pytest.mark.parametrize("status", ["rejected", "failed", "stopped"])
def test_a_pending_pick_the_gate_refuses_gives_way_to_the_next(status: str) -> None:
    base, cl = _r(Settings(), 10.0), _r(Settings(memory_format="channels_last"), 5.0)
    pending = _r(COMPILED, 2.0, compile_cold_s=0.1, gate_pending=True, reason=GATE_PENDING)
    refused = TrialResult(settings=COMPILED, status=status, reason="outputs off by 5%")  # type: ignore[arg-type]
    outcome = _outcome([base, cl, pending])
    ev = Verdicts([refused])
    gate_the_pick(outcome, ev, 0.02, None, "memory")  # type: ignore[arg-type]
    now = next(r for r in outcome.results if r.settings == COMPILED)
    assert now.status == status and not now.gate_pending
    if status != "rejected":
        assert now.reason == "its gate, once it won the pick: outputs off by 5%"
    from advisor.search.pick import pick_for_steps

    assert pick_for_steps(outcome.results, outcome.baseline)[0].chosen.settings == cl.settings


def test_a_pending_candidate_that_does_not_win_is_never_gated() -> None:
    base, cl = _r(Settings(), 10.0), _r(Settings(memory_format="channels_last"), 2.0)
    pending = _r(COMPILED, 5.0, compile_cold_s=0.1, gate_pending=True, reason=GATE_PENDING)
    outcome = _outcome([base, cl, pending])
    ev = Verdicts([])
    assert gate_the_pick(outcome, ev, 0.02, None, "memory") == []  # type: ignore[arg-type]
    assert ev.asked == []


def test_settle_keeps_the_trial_and_takes_the_verdict() -> None:
    pending = _r(COMPILED, 2.0, compile_cold_s=3.0, gate_pending=True, reason=GATE_PENDING,
                 peak_memory_mb=12.0)  # fmt: skip
    verdict = TrialResult(settings=COMPILED, status="rejected", reason="grad off",
                          rejected_by="tolerances.fp32=0.1", rel_error=0.2)  # fmt: skip
    out = settle(pending, verdict)
    assert out.status == "rejected" and out.rejected_by == "tolerances.fp32=0.1"
    assert out.peak_memory_mb == 12.0 and out.compile_cold_s == 3.0 and not out.gate_pending


@pytest.mark.slow  # two train-mode compiles of a small CNN
def test_the_worker_measures_then_gates_a_compiled_candidate_under_dropout() -> None:
    workload = make_workload(model_file=str(DATA / "dropout_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.dropout
    race = Race(limit_ms=1e9, defer_gate=True)  # the race never stops it
    pending = evaluate(workload, COMPILED, CPU, "train", space, gate, race=race)
    assert pending.status == "ok" and pending.gate_pending, pending.reason
    assert pending.reason == GATE_PENDING and pending.rel_error is None
    assert pending.compile_cold_s is not None and pending.compile_check_s is None
    verdict = gate_only(workload, COMPILED, CPU, "train", gate)
    assert verdict.status == "ok", verdict.reason
    assert verdict.rel_error is not None and verdict.rel_error < 1e-4  # the reference's masks
    assert verdict.grad_error is not None and verdict.grad_error < 1e-3
    assert verdict.compile_check_s is not None and verdict.compile_check_s > 0
    assert verdict.measurement is None
    # without dropout nothing is deferred: the capture is the timed step
    plain = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    plain_gate = Gate(plain, CPU, "train", space)
    done = evaluate(plain, COMPILED, CPU, "train", space, plain_gate, race=race)
    assert done.status == "ok" and not done.gate_pending and done.rel_error is not None


@pytest.mark.slow  # an isolated default-effort run whose compile pays back (two compiles)
def test_a_compiled_pick_under_dropout_is_recommended_only_gated(tmp_path: Path) -> None:
    space = tmp_path / "compile.yaml"
    space.write_text(
        "name: compile-dropout\ndevice: cpu\nknobs: {memory_format: [contiguous], "
        "compile: ['off', default]}\n"
        "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 5, max_samples: 15, max_time_s: 0.3}\n"
        "per_layer: false\n"
    )
    advice = advisor.advise(model_file=str(DATA / "dropout_cnn.py"), mode="train",
                            device="cpu", space=str(space), isolate=True,
                            steps=10**12)  # any saving pays back  # fmt: skip
    compiled = next(r for r in advice.results if r.settings.compiled)
    if advice.settings.compiled:
        assert not compiled.gate_pending and compiled.rel_error is not None
        assert compiled.compile_check_s is not None  # the gate's capture compiled, once it won
    if compiled.gate_pending:  # it never won the pick: never captured again, never recommended
        assert not advice.settings.compiled and compiled.compile_check_s is None
    elif compiled.status == "ok":  # it won the pick and was gated (the final check in a fresh
        # process may still have kept the default: a tiny model's compile is near the noise)
        assert compiled.rel_error is not None and compiled.compile_check_s is not None
