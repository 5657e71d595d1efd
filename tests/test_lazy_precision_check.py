"""A precision's training check (seconds of training runs) is paid only for a candidate at it that
could still win the pick: one measured in full whose interval lies above the best accepted
candidate's (plus min_gain) is stopped unjudged, in this process and in a worker alike.

Whether bf16 is fast on this CPU does not matter here: the leader's time is set by the test (a
limit no real step can be under, or one every step is under)."""

from __future__ import annotations

import pytest
import torch

from advisor.advice import precision_verdicts
from advisor.execute.evaluators import InProcessEvaluator
from advisor.execute.isolate import IsolatedEvaluator
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.stats import Race
from advisor.measure.timing import TimingPolicy
from advisor.measure.verdict import CANNOT_WIN, OUT_OF_TIME
from advisor.space import SearchSpace
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec

CPU = torch.device("cpu")
QUICK = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=3, max_samples=5, max_time_s=0.05)
SPACE = SearchSpace(name="t", knobs={}, precision_check={"steps": 8, "batches": 2})
BF16 = Settings(amp="bf16")
# no step takes a nanosecond (every candidate is slower than such a leader); none takes an hour
UNBEATABLE = Race(limit_ms=1e9, judge_below_ms=1e-6)
BEATABLE = Race(limit_ms=1e9, judge_below_ms=3.6e6)


def _workload():  # noqa: ANN202 - a layer workload
    return layer_workload(layer_spec("Conv2d(4, 4, 3, padding=1)", input_shape="2,4,8,8"))


def test_a_candidate_that_cannot_win_is_not_judged_and_one_that_can_is() -> None:
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    r = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK, race=UNBEATABLE)
    assert r.status == "stopped" and r.reason is not None and r.reason.startswith(CANNOT_WIN), r
    assert "bf16 not judged" in r.reason
    assert r.measurement is not None and len(r.measurement.samples_ms) >= 3  # timed in full
    assert r.precision_check is None and gate.checks == []  # no training run was paid
    # the fp32 class needs no training check, and a slow fp32 candidate is not gated either:
    # its verdict would never be read (the re-time's finalists drop it by the same rule)
    fp32 = evaluate(w, Settings(memory_format="channels_last"), CPU, "train", SPACE, gate,
                    policy=QUICK, race=UNBEATABLE)  # fmt: skip
    assert fp32.status == "stopped" and fp32.rel_error is None and fp32.layer_error is None
    assert fp32.reason is not None and fp32.reason.endswith(
        "not gated (the gate's checks are paid only for a candidate that could be picked)"
    )
    assert fp32.measurement is not None and len(fp32.measurement.samples_ms) >= 3
    # PyTorch's default is the baseline every advice reports against: gated whatever its speed
    default = evaluate(w, Settings(), CPU, "train", SPACE, gate, policy=QUICK, race=UNBEATABLE)
    assert default.status == "ok" and default.rel_error is not None, default
    # one that could win is judged, once
    judged = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK, race=BEATABLE)
    assert judged.status in ("ok", "rejected") and judged.precision_check is not None, judged
    assert len(gate.checks) == 1
    # once judged, a slow candidate at that precision is stopped ungated like any other, and
    # one that could win is gated with the verdict known (no second training check)
    cl_bf16 = BF16.model_copy(update={"memory_format": "channels_last"})
    again = evaluate(w, cl_bf16, CPU, "train", SPACE, gate, policy=QUICK, race=UNBEATABLE)
    assert again.status == "stopped" and "not gated" in (again.reason or ""), again
    near = evaluate(w, cl_bf16, CPU, "train", SPACE, gate, policy=QUICK, race=BEATABLE)
    assert near.status in ("ok", "rejected") and near.precision_check is not None, near
    assert len(gate.checks) == 1


def test_without_a_leader_every_precision_is_judged() -> None:
    """The first candidates (no accepted leader yet, no race) are judged as before."""
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    r = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK)
    assert r.status in ("ok", "rejected") and r.precision_check is not None, r


# isolated: a worker (3 s), in the slow run
@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_rule_holds_in_a_worker_process(isolate: bool) -> None:
    """The race crosses the pipe whole: a worker applies the same rule."""
    w = _workload()
    ev = (
        IsolatedEvaluator(w.info, CPU, "train", SPACE, timeout_s=120.0)
        if isolate
        else InProcessEvaluator(w, CPU, "train", SPACE)
    )
    try:
        r = ev(BF16, race=UNBEATABLE)
        assert r.status == "stopped" and r.reason is not None, r
        assert r.reason.startswith(CANNOT_WIN) and r.precision_check is None
        judged = ev(BF16, race=BEATABLE)
        assert judged.precision_check is not None, judged
    finally:
        ev.close()


def test_the_advice_says_a_precision_was_not_judged_and_why() -> None:
    w = _workload()
    gate = Gate(w, CPU, "train", SPACE)
    stopped = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK, race=UNBEATABLE)
    lines = precision_verdicts([stopped])
    assert lines == [
        "bf16: not judged on this model: no candidate at it could win (slower than the best: "
        "its training check is paid only for one that could be picked)"
    ]
    # raced out (the sign test), or out of budget mid-check: said the same way; an fp32
    # candidate stopped by the race has no precision to judge
    raced = stopped.model_copy(update={"reason": "stopped after 5 samples: slower than ..."})
    late = stopped.model_copy(update={"reason": OUT_OF_TIME})
    slow_fp32 = raced.model_copy(update={"settings": Settings(memory_format="channels_last"),
                                         "precision": "fp32"})  # fmt: skip
    assert precision_verdicts([raced, slow_fp32]) == lines
    assert precision_verdicts([late]) == [
        "bf16: not judged on this model: the budget ran out during its training check"
    ]
    # a verdict measured for the same precision in the run is what the advice says
    judged = evaluate(w, BF16, CPU, "train", SPACE, gate, policy=QUICK, race=BEATABLE)
    assert judged.precision_check is not None
    assert precision_verdicts([stopped, judged]) == [judged.precision_check.summary]


def test_the_search_races_against_the_leader_with_the_finalists_rule() -> None:
    """The search's race: stopped beyond the margin; unjudged above the leader's CI upper end plus
    min_gain, the bound `advisor.execute.retime.finalists` drops a candidate at."""
    space = SearchSpace(name="t", knobs={}, min_gain=0.02, race_margin=1.5)
    race = space.race_against(10.0)
    assert race.judge_below_ms == pytest.approx(10.2)
    assert race.limit_ms == pytest.approx(10.2 * 1.5)
