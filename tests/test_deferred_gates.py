"""A candidate at a precision not judged yet is measured without its gate during the search and
gated once the search ends, fastest first, against the final leader (advisor.search.deferred_gates):
which training checks are paid no longer depends on the order the trials ran in."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import torch
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

import advisor
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement, Race
from advisor.measure.verdict import CANNOT_WIN, OUT_OF_TIME, PRECISION_PENDING, PrecisionCheck
from advisor.search.deferred_gates import settle_pending
from advisor.search.outcome import unsettled
from advisor.search.study import first_results
from tests.test_lazy_precision_check import BF16, QUICK, SPACE, _workload

CPU = torch.device("cpu")
# every step is under an hour: each candidate could win against such a leader
DEFERRED = Race(limit_ms=1e9, judge_below_ms=3.6e6, defer_gate=True)

DEFAULT = Settings()
CL = Settings(memory_format="channels_last")
FP16 = Settings(amp="fp16")
CL_BF16 = Settings(memory_format="channels_last", amp="bf16")
KNOBS = {"memory_format": ["contiguous", "channels_last"], "amp": ["off", "fp16", "bf16"]}


def test_a_search_race_measures_an_unjudged_precision_without_its_gate() -> None:
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    r = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK, race=DEFERRED)
    assert r.status == "ok" and r.gate_pending and r.reason == PRECISION_PENDING, r
    assert r.measurement is not None and len(r.measurement.samples_ms) >= 3  # timed in full
    assert r.precision_check is None and gate.checks == []  # no training run was paid
    assert r.rel_error is None and r.layer_error is None and r.gate_s is None  # nor the gate
    # the fp32 class and PyTorch's default need no training check: gated at once, as before
    for s in (CL, DEFAULT):
        now = evaluate(w, s, CPU, "train", SPACE, gate, policy=QUICK, race=DEFERRED)
        assert now.status == "ok" and not now.gate_pending and now.rel_error is not None, now
    # a precision judged already is gated at once too: nothing is left to defer
    judged = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK)
    assert judged.precision_check is not None
    again = evaluate(w, CL_BF16, CPU, "train", SPACE, gate, policy=QUICK, race=DEFERRED)
    assert not again.gate_pending and again.precision_check is not None
    assert len(gate.checks) == 1


# ---- the settle step, on a study's trials ----------------------------------------------------


def _r(settings: Settings, ms: float, status: str = "ok", **kw: object) -> TrialResult:
    samples = [ms * (1 + 0.001 * i) for i in range(7)]
    precision = {"off": "fp32"}.get(settings.amp, settings.amp)
    return TrialResult(settings=settings, status=status, precision=precision,  # type: ignore[arg-type]
                       measurement=Measurement(samples_ms=samples, first_call_ms=1.0),
                       wall_s=1.0, **kw)  # type: ignore[arg-type]  # fmt: skip


def _pending(settings: Settings, ms: float) -> TrialResult:
    return _r(settings, ms, gate_pending=True, reason=PRECISION_PENDING)


def _ungated(settings: Settings, ms: float) -> TrialResult:
    return _r(settings, ms, "stopped", reason=f"{CANNOT_WIN}: slower than the best then")


def _study(results: list[TrialResult]) -> SimpleNamespace:
    """A study holding these results as told trials, PyTorch's default first among the plan's
    candidates (what `settle_pending` reads of a plan)."""
    study = optuna.create_study()
    for r in results:
        params = {"memory_format": r.settings.memory_format, "amp": r.settings.amp}
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.COMPLETE, value=r.median_ms, params=params,
            distributions={k: CategoricalDistribution(KNOBS[k]) for k in params},
            user_attrs={"result": r.model_dump(mode="json"), "label": r.settings.label()},
        ))  # fmt: skip
    return SimpleNamespace(study=study, cands=[DEFAULT])


class Verdicts:
    """An evaluator whose gate answers from a table (what a worker's gate said), recording which
    candidates it was asked to gate: the order of the gates is what is tested here."""

    def __init__(self, rejected: list[Settings]) -> None:
        self.rejected = rejected
        self.asked: list[Settings] = []

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        self.asked.append(settings)
        precision = {"off": "fp32"}.get(settings.amp, settings.amp)
        check = None
        if precision != "fp32":
            check = PrecisionCheck(precision=precision, own_path=Settings(amp=settings.amp),
                                   mode="train", accepted=settings not in self.rejected,
                                   gap=0.0, band=0.0, summary=f"{precision}: as the test says")  # fmt: skip
        if settings in self.rejected:
            return TrialResult(settings=settings, status="rejected", reason="off by 5%",
                               precision=precision, precision_check=check, wall_s=2.0)  # fmt: skip
        return TrialResult(settings=settings, status="ok", rel_error=1e-3, gate_s=0.1,
                           precision=precision, precision_check=check, wall_s=2.0)  # fmt: skip


def _settle(
    results: list[TrialResult], rejected: list[Settings]
) -> tuple[list[Settings], dict[str, TrialResult], list[PrecisionCheck]]:
    """The candidates gated, in order; every result afterwards, by label; the verdicts kept."""
    plan = _study(results)
    ev = Verdicts(rejected)
    recorded: list[PrecisionCheck] = []
    settle_pending(plan, ev, 0.02, None, 1e18, recorded.append, [])  # type: ignore[arg-type]
    return ev.asked, {r.settings.label(): r for r in first_results(plan.study)}, recorded


# the default, a bf16 candidate fastest of all, a fp32 one stopped ungated against it, an fp16
# one between those and the default, and a bf16 one slower than the default
TRIALS = [_r(DEFAULT, 10.0, rel_error=0.0), _pending(CL_BF16, 5.0), _ungated(CL, 7.0),
          _pending(FP16, 9.5), _pending(BF16, 12.0)]  # fmt: skip


@pytest.mark.parametrize("order", [TRIALS, TRIALS[:1] + TRIALS[:0:-1]], ids=["ran", "reversed"])
def test_the_fastest_is_gated_and_nothing_slower_than_the_final_leader(
    order: list[TrialResult],
) -> None:
    asked, by, recorded = _settle(order, rejected=[])
    assert asked == [CL_BF16]  # one gate, one training check: bf16's
    pick = by[CL_BF16.label()]
    assert pick.status == "ok" and not pick.gate_pending and pick.rel_error == 1e-3
    assert pick.wall_s == 3.0  # the trial's and its gate's
    assert [c.own_path for c in recorded] == [Settings(amp="bf16")]
    assert pick.measurement is not None
    bar = f"slower than the best accepted candidate's {pick.measurement.ci_high_ms * 1.02:.3f} ms"
    reasons = {}
    for s in (CL, FP16, BF16):  # above the final bar: stopped, the bar named in the reason
        r = by[s.label()]
        assert r.status == "stopped" and not r.gate_pending and r.reason is not None, r
        assert r.reason.startswith(CANNOT_WIN) and bar in r.reason, r.reason
        reasons[s.label()] = r.reason
    assert "fp16 not judged" in reasons[FP16.label()]  # never judged on this model
    assert "not gated" in reasons[CL.label()] and "not judged" not in reasons[CL.label()]
    assert "bf16 not judged" not in reasons[BF16.label()]  # bf16 was judged, by the pick


@pytest.mark.parametrize("order", [TRIALS, TRIALS[:1] + TRIALS[:0:-1]], ids=["ran", "reversed"])
def test_a_rejected_leader_opens_the_candidates_it_stopped(order: list[TrialResult]) -> None:
    """bf16 rejected: channels_last, stopped ungated because bf16 was faster, is gated and
    picked; fp16 is above channels_last's bar, so its training check is never paid."""
    asked, by, _ = _settle(order, rejected=[CL_BF16])
    assert asked == [CL_BF16, CL]
    cl = by[CL.label()]
    assert by[CL_BF16.label()].status == "rejected" and cl.status == "ok"
    assert cl.measurement is not None
    fp16 = by[FP16.label()]
    assert fp16.status == "stopped", fp16
    assert f"candidate's {cl.measurement.ci_high_ms * 1.02:.3f} ms" in (fp16.reason or "")
    assert by[BF16.label()].status == "stopped"


class OutOfTime(Verdicts):
    """The budget is spent: the gate's training check stops at once, as `gate_only`'s does."""

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        self.asked.append(settings)
        return TrialResult(settings=settings, status="stopped", reason=OUT_OF_TIME,
                           precision=settings.amp)  # fmt: skip


def test_a_check_the_budget_cuts_is_said_so_and_judged_by_a_later_run() -> None:
    plan = _study(TRIALS)
    cut = OutOfTime([])
    settle_pending(plan, cut, 0.02, None, 0.0, lambda c: None, [])  # type: ignore[arg-type]
    assert cut.asked == [CL_BF16]  # one try, then no more gates: no time is left
    by = {r.settings.label(): r for r in first_results(plan.study)}
    assert by[CL_BF16.label()].status == "stopped"
    assert by[CL_BF16.label()].reason == OUT_OF_TIME  # the advice's "the budget ran out"
    # a later run of the study, with time: bf16 is judged then, and the rest settle
    later = Verdicts([])
    settle_pending(plan, later, 0.02, None, 1e18, lambda c: None, [])  # type: ignore[arg-type]
    assert later.asked == [CL_BF16]
    by = {r.settings.label(): r for r in first_results(plan.study)}
    assert by[CL_BF16.label()].status == "ok"
    assert all(by[s.label()].status == "stopped" for s in (CL, FP16, BF16))


def test_a_pending_result_the_search_left_is_never_picked() -> None:
    """Where the search stopped before gating (Ctrl-C, a `work` process), a pending result reads
    as stopped: it cannot be recommended ungated."""
    r = unsettled(_pending(BF16, 5.0))
    assert r.status == "stopped" and not r.gate_pending and PRECISION_PENDING in (r.reason or "")
    assert unsettled(TRIALS[0]) is TRIALS[0]


def test_an_advise_gates_what_it_accepts_and_leaves_nothing_pending(tmp_path: Path) -> None:
    """End to end, in this process: each precision is judged at most once, every accepted
    candidate was gated, and nothing is left pending."""
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
    results = advice.results
    assert results and not any(r.gate_pending for r in results)
    assert all(r.rel_error is not None for r in results if r.status == "ok")
    paid = [r.precision_check for r in results
            if r.precision_check is not None and not r.precision_check.reused
            and r.settings.amp != "off"]  # fmt: skip
    assert len({c.own_path.label() for c in paid}) <= 1  # bf16, once if at all
