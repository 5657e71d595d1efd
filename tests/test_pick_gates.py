"""A candidate's dear gate waits until the pick needs it (advisor/search/pick_gates.py): in its
trial under a race it is measured in full and left pending; the pick asks for the verdicts it
needs, keeps them in the ledger, and never recommends a candidate ungated.

The runner's side is measured for real on a layer; the pick's control flow uses an evaluator
whose gate answers from a table (what a worker's gate said), recording what it was asked."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import torch

import advisor
from advisor.advice import build_advice, precision_verdicts
from advisor.device.environment import current_environment
from advisor.execute.evaluators import InProcessEvaluator
from advisor.execute.gating import gate_only, with_verdict
from advisor.execute.isolate import IsolatedEvaluator
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement, Race
from advisor.measure.stop import Stop
from advisor.measure.stopping import TimingPolicy
from advisor.measure.verdict import PrecisionCheck
from advisor.search.ledger import Ledger
from advisor.search.options import SearchOutcome
from advisor.search.pick import runner_up
from advisor.search.pick_gates import gated_pick
from advisor.space import SearchSpace, load_space
from advisor.workload.args import make_workload
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec

DATA = Path(__file__).parent / "data"
CPU = torch.device("cpu")
QUICK = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=3, max_samples=5, max_time_s=0.05)
SPACE = SearchSpace(name="t", knobs={}, precision_check={"steps": 8, "batches": 2})
DEFAULT = Settings()
CL = Settings(memory_format="channels_last")
BF16 = Settings(amp="bf16")
FP16 = Settings(amp="fp16")
CL_BF16 = Settings(memory_format="channels_last", amp="bf16")
COMPILED = Settings(compile="default")
# no step takes a nanosecond (every candidate lies above such a bar); none takes an hour
ABOVE = Race(limit_ms=1e9, bar_ms=1e-6)
BELOW = Race(limit_ms=1e9, bar_ms=3.6e6)


def _workload():  # noqa: ANN202 - a layer workload
    return layer_workload(layer_spec("Conv2d(4, 4, 3, padding=1)", input_shape="2,4,8,8"))


def test_the_gates_own_captures_are_counted_by_the_next_verdict() -> None:
    # The references (captured as the gate is built) and the noise floor (when a verdict needs
    # it) are the gate's checks: counted in the next verdict's gate_s, once, not as harness.
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    references_s = gate.unbilled_s
    assert references_s > 0
    first = evaluate(w, DEFAULT, CPU, "train", SPACE, gate, policy=QUICK)
    assert first.gate_s is not None and first.gate_s > references_s and gate.unbilled_s == 0
    gate.noise()
    noise_s = gate.unbilled_s
    assert noise_s > 0  # float64 and the perturbed fp32 answers
    second = evaluate(w, CL, CPU, "train", SPACE, gate, policy=QUICK)
    assert second.gate_s is not None and second.gate_s > noise_s and gate.unbilled_s == 0
    gate.noise()  # computed once: nothing more to count
    assert gate.unbilled_s == 0


# ---- the trial: what waits ---------------------------------------------------------------


def test_under_a_race_a_precision_not_judged_yet_waits_and_the_cheap_gates_do_not() -> None:
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    r = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK, race=BELOW)
    assert r.status == "ok" and r.pending == "precision" and "not gated" in (r.reason or ""), r
    assert r.measurement is not None and len(r.measurement.samples_ms) >= 3  # timed in full
    assert r.precision_check is None and gate.checks == []  # no training run was paid
    assert r.rel_error is None and r.layer_error is None and r.gate_s is None  # nor the gate
    # the fp32 class and PyTorch's default need no training check: gated at once
    for s in (CL, DEFAULT):
        now = evaluate(w, s, CPU, "train", SPACE, gate, policy=QUICK, race=BELOW)
        assert now.status == "ok" and now.pending is None and now.rel_error is not None, now
    # without a race (no leader yet) a precision is judged in its trial
    judged = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK)
    assert judged.precision_check is not None and len(gate.checks) == 1
    # once judged, a candidate at that precision under the bar is gated at once, the verdict
    # known (no second training check)
    again = evaluate(w, CL_BF16, CPU, "train", SPACE, gate, policy=QUICK, race=BELOW)
    assert again.pending is None and again.precision_check is not None and len(gate.checks) == 1


def test_above_the_bar_even_the_cheap_checks_wait_but_the_default_is_gated() -> None:
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    slow = evaluate(w, CL, CPU, "train", SPACE, gate, policy=QUICK, race=ABOVE)
    assert slow.status == "ok" and slow.pending == "checks" and slow.rel_error is None, slow
    assert slow.measurement is not None and len(slow.measurement.samples_ms) >= 3
    default = evaluate(w, DEFAULT, CPU, "train", SPACE, gate, policy=QUICK, race=ABOVE)
    assert default.pending is None and default.rel_error is not None  # the baseline
    # the gate alone, asked for later, gives the verdict its trial left out
    verdict = gate_only(w, CL, CPU, "train", gate)
    assert verdict.status == "ok" and verdict.rel_error is not None and verdict.measurement is None
    done = with_verdict(slow, verdict)
    assert done.pending is None and done.measurement == slow.measurement
    assert done.rel_error is not None


# isolated: a worker (3 s), in the slow run
@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_worker_applies_the_same_rule(isolate: bool) -> None:
    """The race crosses the pipe whole; the gate asked for later runs in the worker too."""
    w = _workload()
    ev = (IsolatedEvaluator(w.info, CPU, "train", SPACE, timeout_s=120.0) if isolate
          else InProcessEvaluator(w, CPU, "train", SPACE))  # fmt: skip
    try:
        r = ev(BF16, race=BELOW)
        assert r.pending == "precision" and r.precision_check is None, r
        verdict = ev.gate(BF16)
        assert verdict.precision_check is not None and verdict.status in ("ok", "rejected")
    finally:
        ev.close()


# ---- the pick: what is asked for --------------------------------------------------------


def _r(settings: Settings, ms: float, **kw: object) -> TrialResult:
    return TrialResult(settings=settings, status="ok", precision=_precision(settings),
                       measurement=Measurement(samples_ms=[ms * f for f in (0.99, 1.0, 1.01)] * 3),
                       **kw)  # type: ignore[arg-type]  # fmt: skip


def _precision(s: Settings) -> str:
    return {"off": "fp32"}.get(s.amp, s.amp)


def _waits(settings: Settings, ms: float) -> TrialResult:
    return _r(settings, ms, pending="precision" if settings.amp != "off" else "checks",
              wall_s=1.0)


class Verdicts:
    """An evaluator whose gate answers from a table, recording what it was asked to gate."""

    def __init__(self, rejected: list[Settings] = (), out_of_time: bool = False) -> None:  # type: ignore[assignment]
        self.rejected, self.out_of_time = list(rejected), out_of_time
        self.asked: list[Settings] = []
        self.known: list[PrecisionCheck] = []

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        self.asked.append(settings)
        precision = _precision(settings)
        if self.out_of_time and precision != "fp32":
            return TrialResult(settings=settings, status="stopped", precision=precision,
                               stop=Stop(kind="out_of_time"))  # fmt: skip
        check = None
        if precision != "fp32":
            check = PrecisionCheck(precision=precision, own_path=Settings(amp=settings.amp),
                                   mode="train", accepted=settings not in self.rejected,
                                   gap=0.0, band=0.0, summary=f"{precision}: as the test says")  # fmt: skip
        status = "rejected" if settings in self.rejected else "ok"
        return TrialResult(settings=settings, status=status, rel_error=1e-3, gate_s=0.1,  # type: ignore[arg-type]
                           reason="off by 5%" if status == "rejected" else None,
                           precision=precision, precision_check=check, wall_s=2.0)  # fmt: skip

    def know(self, checks: list[PrecisionCheck]) -> None:
        self.known += checks


# the default, a bf16 candidate fastest of all, an fp32 one whose checks waited (measured above
# bf16's bar), an fp16 one between those and the default, and a bf16 one slower than the default
TRIALS = [_r(DEFAULT, 10.0, rel_error=0.0), _waits(CL_BF16, 5.0), _waits(CL, 7.0),
          _waits(FP16, 9.5), _waits(BF16, 12.0)]  # fmt: skip


def _outcome(results: list[TrialResult], study: optuna.Study | None = None,
             run: str = "run") -> SearchOutcome:  # fmt: skip
    ledger = Ledger(study, DEFAULT, run=run)
    if study is None:
        ledger = Ledger.of(results, DEFAULT)
    return SearchOutcome(ledger=ledger, environment=current_environment(CPU))


@pytest.mark.parametrize("order", [TRIALS, TRIALS[:1] + TRIALS[:0:-1]], ids=["ran", "reversed"])
def test_the_pick_is_gated_and_nothing_it_does_not_need(order: list[TrialResult]) -> None:
    outcome, ev = _outcome(order), Verdicts()
    pick = gated_pick(outcome, ev, Contest())  # type: ignore[arg-type]
    assert ev.asked == [CL_BF16]  # one gate, one training check: bf16's
    assert pick.chosen.settings == CL_BF16 and pick.chosen.pending is None
    assert pick.chosen.rel_error == 1e-3 and pick.chosen.wall_s == 3.0  # the trial's and its gate's
    assert [c.own_path for c in outcome.ledger.checks()] == [Settings(amp="bf16")]
    assert [c.own_path for c in ev.known] == [Settings(amp="bf16")]
    assert all(outcome.ledger.standing(s).pending is not None  # type: ignore[union-attr]
               for s in (CL, FP16, BF16))  # never gated
    assert precision_verdicts(outcome.results)[1:] == [
        "fp16: not judged on this model: no candidate at it could win (slower than the best: its "
        "training check is paid only for one that could be picked)"
    ]
    assert gated_pick(outcome, ev, Contest()).chosen.settings == CL_BF16  # type: ignore[arg-type]
    assert ev.asked == [CL_BF16]  # asked once


def test_a_rejected_pick_gives_way_to_the_next_which_is_gated_in_turn() -> None:
    outcome, ev = _outcome(TRIALS), Verdicts(rejected=[CL_BF16])
    pick = gated_pick(outcome, ev, Contest())  # type: ignore[arg-type]
    assert ev.asked == [CL_BF16, CL]  # fp16 lies above channels_last: never judged
    assert pick.chosen.settings == CL and pick.chosen.rel_error == 1e-3
    assert outcome.ledger.standing(CL_BF16).status == "rejected"  # type: ignore[union-attr]


def test_a_fastest_whose_verdict_would_not_change_the_pick_is_not_gated() -> None:
    # channels_last + bf16 within noise of channels_last: the simpler one is the pick either way
    tie = [_r(DEFAULT, 10.0, rel_error=0.0), _r(CL, 5.05, rel_error=0.0), _waits(CL_BF16, 5.0)]
    outcome, ev = _outcome(tie), Verdicts()
    pick = gated_pick(outcome, ev, Contest())  # type: ignore[arg-type]
    assert pick.chosen.settings == CL and pick.fastest.settings == CL_BF16 and ev.asked == []
    # where the default would be picked without it, the fastest's verdict is needed
    close = [_r(DEFAULT, 5.1, rel_error=0.0), _r(CL, 5.05, rel_error=0.0), _waits(CL_BF16, 4.0)]
    outcome, ev = _outcome(close), Verdicts()
    assert gated_pick(outcome, ev, Contest()).chosen.settings == CL_BF16  # type: ignore[arg-type]
    assert ev.asked == [CL_BF16]


def test_a_kept_defaults_challenger_is_gated_whatever_the_trials_order() -> None:
    """Where the default is kept, its fastest eager alternative is checked against it where the
    user runs it: gated first, whether its checks waited in its trial or not."""
    kept = [_r(DEFAULT, 10.0, rel_error=0.0), _waits(CL, 10.2), _r(BF16, 10.8, rel_error=0.0)]
    outcome, ev = _outcome(kept), Verdicts()
    assert gated_pick(outcome, ev, Contest()).chosen.settings == DEFAULT  # type: ignore[arg-type]
    assert ev.asked == []  # no challenge asked for: nothing more is gated
    pick = gated_pick(outcome, ev, Contest(), check_always=True)  # type: ignore[arg-type]
    assert pick.chosen.settings == DEFAULT and ev.asked == [CL]
    assert outcome.ledger.standing(CL).pending is None  # type: ignore[union-attr]
    # rejected, it gives way to the next fastest, gated before it (here: already gated)
    outcome, ev = _outcome(kept), Verdicts(rejected=[CL])
    gated_pick(outcome, ev, Contest(), check_always=True)  # type: ignore[arg-type]
    assert ev.asked == [CL]
    # quick effort does not check an alternative slower than the default beyond noise
    slow = [_r(DEFAULT, 10.0, rel_error=0.0), _waits(CL, 12.0)]
    outcome, ev = _outcome(slow), Verdicts()
    gated_pick(outcome, ev, Contest(), check_always=False)  # type: ignore[arg-type]
    assert ev.asked == []
    gated_pick(outcome, ev, Contest(), check_always=True)  # type: ignore[arg-type]
    assert ev.asked == [CL]


def _retimed(r: TrialResult) -> TrialResult:
    return r.model_copy(update={"retimed": True})


# channels_last the pick, beyond noise; two re-timed finalists of other families, whose checks
# and training checks waited in their trials (measured above channels_last's bar)
RUNNERS = [_retimed(_r(DEFAULT, 10.0, rel_error=0.0)), _retimed(_r(CL, 7.0, rel_error=0.0)),
           _retimed(_waits(BF16, 7.5)), _retimed(_waits(FP16, 8.0))]  # fmt: skip


@pytest.mark.parametrize("order", [RUNNERS, RUNNERS[::-1]], ids=["ran", "reversed"])
def test_the_final_checks_runner_up_is_gated_whatever_the_trials_order(
    order: list[TrialResult],
) -> None:
    """The final check recommends its runner-up where it beats the pick there: the fastest
    re-timed finalist of another family is gated first, not passed over for a slower one whose
    checks happened to run in its trial."""
    outcome, ev = _outcome(order), Verdicts()
    assert gated_pick(outcome, ev, Contest()).chosen.settings == CL  # type: ignore[arg-type]
    assert ev.asked == []  # no final check asked for: nothing more is gated
    gated_pick(outcome, ev, Contest(), check_always=False)  # type: ignore[arg-type]
    assert ev.asked == []  # quick: a margin beyond noise leaves no check to run
    gated_pick(outcome, ev, Contest(), check_always=True)  # type: ignore[arg-type]
    assert ev.asked == [BF16]
    standing = outcome.ledger.standing(BF16)
    assert standing is not None and standing.pending is None
    pick = outcome.ledger.standing(CL)
    assert pick is not None and runner_up(outcome.results, pick, outcome.baseline) == standing
    # rejected, it gives way to the next of another family, gated in turn
    outcome, ev = _outcome(order), Verdicts(rejected=[BF16])
    gated_pick(outcome, ev, Contest(), check_always=True)  # type: ignore[arg-type]
    assert ev.asked == [BF16, FP16]


def test_a_check_the_budget_cuts_is_judged_by_a_later_run_of_the_study() -> None:
    study = optuna.create_study()
    for r in TRIALS:  # as trials of a stored study
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=r.median_ms,
            params={"p": r.settings.label()},
            distributions={"p": optuna.distributions.CategoricalDistribution(
                [t.settings.label() for t in TRIALS])},
            user_attrs={"result": r.model_dump(mode="json")}))  # fmt: skip
    cut = Verdicts(out_of_time=True)
    outcome = _outcome([], study, run="first")
    pick = gated_pick(outcome, cut, Contest())  # type: ignore[arg-type]
    assert cut.asked[0] == CL_BF16 and pick.chosen.pending is None
    assert outcome.ledger.standing(CL_BF16).stop.kind == "out_of_time"  # type: ignore[union-attr]
    # a later run of the study, with time: bf16 is open again and judged then
    later = Verdicts()
    again = _outcome([], study, run="second")
    assert again.ledger.standing(CL_BF16).pending == "precision"  # type: ignore[union-attr]
    assert gated_pick(again, later, Contest()).chosen.settings == CL_BF16  # type: ignore[arg-type]
    assert later.asked == [CL_BF16]


def test_a_pick_left_ungated_is_never_recommended() -> None:
    """Where the run ended before the pick was gated, the advice keeps PyTorch's default."""
    outcome = _outcome(TRIALS)
    advice = build_advice(outcome, _workload().info, "train", "s")
    assert advice.settings == DEFAULT and advice.pick.kept == "ungated"
    assert "was not gated" in advice.config.result.why  # type: ignore[union-attr]


def test_an_advise_gates_what_it_recommends_and_judges_a_precision_at_most_once(
    tmp_path: Path,
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "schema_version: 1\nname: t\ndevice: cpu\n"
        "knobs: {memory_format: [contiguous, channels_last], amp: [\"off\", bf16]}\n"
        "precision_check: {steps: 8, batches: 2}\nbudget: {trials: 8, time_s: 120}\n"
        "timing: {warmup_runs: 1, warmup_s: 0.0, min_samples: 3, max_samples: 5, "
        "max_time_s: 0.05}\n"
    )
    advice = advisor.advise(layer="Conv2d(8, 8, 3, padding=1)", input_shape="4,8,16,16",
                            mode="train", device="cpu", space=str(space), storage="memory",
                            effort="quick")  # fmt: skip
    assert advice.pick.chosen.pending is None
    assert all(r.rel_error is not None for r in advice.results if r.status == "ok" and not r.pending)
    paid = [r.precision_check for r in advice.results
            if r.precision_check is not None and not r.precision_check.reused
            and r.settings.amp != "off"]  # fmt: skip
    assert len({c.own_path.label() for c in paid}) <= 1  # bf16, once if at all


@pytest.mark.slow  # two train-mode compiles of a small CNN
def test_a_compiled_candidate_under_dropout_waits_for_its_capture() -> None:
    workload = make_workload(model_file=str(DATA / "dropout_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.dropout
    pending = evaluate(workload, COMPILED, CPU, "train", space, gate, race=BELOW)
    assert pending.status == "ok" and pending.pending == "capture", pending.reason
    assert pending.rel_error is None and pending.compile_cold_s is not None
    assert pending.compile_check_s is None
    verdict = gate_only(workload, COMPILED, CPU, "train", gate)
    assert verdict.status == "ok", verdict.reason
    assert verdict.rel_error is not None and verdict.rel_error < 1e-4  # the reference's masks
    assert verdict.grad_error is not None and verdict.grad_error < 1e-3
    assert verdict.compile_check_s is not None and verdict.compile_check_s > 0
    # without dropout nothing waits: the capture is the timed step
    plain = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    done = evaluate(plain, COMPILED, CPU, "train", space, Gate(plain, CPU, "train", space),
                    race=BELOW)  # fmt: skip
    assert done.status == "ok" and done.pending is None and done.rel_error is not None


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
        assert compiled.pending is None and compiled.rel_error is not None
        assert compiled.compile_check_s is not None  # the gate's capture compiled, once it won
    if compiled.pending is not None:  # never needed: never captured again, never recommended
        assert not advice.settings.compiled and compiled.compile_check_s is None
