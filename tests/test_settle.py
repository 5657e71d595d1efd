"""A process settles each layout once (advisor.measure.settle): the first step it measures in a
memory format warms up until it has stopped getting faster; a later one in that layout warms up
with the policy's runs, in a trial, a screen and the re-time alike. A layer's every step settles,
with no time floor on a CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import advisor.execute.retime as retime_mod
import advisor.execute.runner as runner_mod
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.settle import settles
from advisor.measure.stats import Measurement
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import measure, warm_up
from advisor.space import SearchSpace
from advisor.workload.build import Workload, layer_workload, object_workload
from advisor.workload.layer_spec import layer_spec
from tests.conftest import FakeClock
from tests.test_timing import COLD, STEADY

CPU = torch.device("cpu")
POLICY = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=7, max_samples=7,
                      target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
CL = Settings(memory_format="channels_last")


def _workload() -> Workload:
    """A model: a layer's steps follow a rule of their own."""
    return object_workload(torch.nn.Conv2d(4, 8, 3), torch.randn(1, 4, 16, 16))


def _layer() -> Workload:
    return layer_workload(layer_spec("Conv2d(4, 8, 3)", input_shape="1,4,16,16"))


def test_the_first_step_in_a_layout_settles_and_asking_records_it() -> None:
    w = _workload()
    assert settles(w, 0, "contiguous") and not settles(w, 0, "contiguous")
    assert settles(w, 0, "channels_last")  # another layout: its own one-time costs
    assert settles(w, 1, "contiguous")  # another shape case: its own buffers
    assert settles(_workload(), 0, "contiguous")  # another workload (a process's own)


def test_a_step_in_a_settled_layout_warms_up_with_the_policy_s_runs() -> None:
    clock = FakeClock(COLD + STEADY)
    m = measure(clock.step, CPU, POLICY, clock=clock, settle=False)
    assert m.warmup_runs == POLICY.warmup_runs  # as before issue 56: no settling
    # the re-time's warm-up: the first finalist settles, the second (its layout settled) not
    clock = FakeClock(COLD + STEADY)
    warm_up([clock.step, clock.step], [lambda: None] * 2, 2, clock, device=CPU, settle_s=10,
            settles=[True, False])  # fmt: skip
    assert clock.calls == len(COLD) + 2


def _warm_ups(
    monkeypatch: pytest.MonkeyPatch, w: Workload, settings: list[Settings], warmup_s: float
) -> list[tuple[bool, float]]:
    """Each trial's (settles, its policy's warmup_s), as the runner asks `measure`."""
    asked: list[tuple[bool, float]] = []
    real = runner_mod.measure

    def spy(fn: Any, device: torch.device, policy: TimingPolicy, **kw: Any) -> Measurement:
        asked.append((kw["settle"], policy.warmup_s))
        return real(fn, device, policy, **kw)

    monkeypatch.setattr(runner_mod, "measure", spy)
    space = SearchSpace(name="s", knobs={})
    gate = Gate(w, CPU, "infer", space)
    policy = TimingPolicy(warmup_runs=1, warmup_s=warmup_s, min_samples=3, max_samples=3,
                          max_time_s=0.01)  # fmt: skip
    for s in settings:
        evaluate(w, s, CPU, "infer", space, gate, policy=policy)
    return asked


def test_trials_settle_the_first_candidate_in_each_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    trials = [Settings(), Settings(amp="bf16"), CL, CL.model_copy(update={"amp": "bf16"})]
    asked = _warm_ups(monkeypatch, _workload(), trials, 0.0)
    assert [settle for settle, _ in asked] == [True, False, True, False]


def test_every_step_of_a_layer_settles_with_no_time_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _layer()
    trials = [Settings(), Settings(conv_impl="unfold_gemm"), Settings()]
    assert _warm_ups(monkeypatch, w, trials, 0.05) == [(True, 0.0)] * 3
    assert w.warmed == set()  # a layer's steps record nothing: each settles


def test_the_re_time_settles_only_a_finalist_whose_layout_the_process_has_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[bool]] = []
    real = retime_mod.warm_up

    def spy(*args: Any, **kw: Any) -> list[float]:
        asked.append(list(kw["settles"]))
        return real(*args, **kw)

    monkeypatch.setattr(retime_mod, "warm_up", spy)
    w = _workload()
    settles(w, 0, "contiguous")  # the default's trial ran in this process
    rs = [TrialResult(settings=s, status="ok", measurement=Measurement(samples_ms=[1.0]))
          for s in (Settings(), CL)]  # fmt: skip
    policy = TimingPolicy(warmup_runs=2, min_samples=3, max_samples=3, max_time_s=0.01)
    retime_mod.retime(w, rs, CPU, "infer", policy)
    assert asked == [[False, True]]
    assert w.warmed == {(0, "contiguous"), (0, "channels_last")}
