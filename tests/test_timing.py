import contextlib
import math
from collections.abc import Callable

import pytest
import torch

from advisor.measure.settle import settling
from advisor.measure.stats import Measurement, clearly_faster, mann_whitney_p, median_ci, speedup
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import interleave, measure, reps_for, warm_up
from tests.conftest import FakeClock

CPU = torch.device("cpu")


def test_measure_with_injected_clock_is_exact() -> None:
    # first call 50 ms, two warm-up runs 9 ms, then samples 1..7 ms (any order)
    durations = [0.050, 0.009, 0.009] + [x / 1000 for x in (4, 1, 7, 2, 6, 3, 5)] + [0.001] * 50
    clock = FakeClock(durations)
    policy = TimingPolicy(
        warmup_runs=2,
        warmup_s=0.0,
        min_samples=7,
        max_samples=7,
        target_rel_ci=1e-9,
        max_time_s=100,
    )
    m = measure(clock.step, CPU, policy, clock=clock)
    assert m.first_call_ms == pytest.approx(50.0)
    assert m.warmup_runs == 2
    assert m.samples_ms == pytest.approx([4, 1, 7, 2, 6, 3, 5])
    assert m.median_ms == pytest.approx(4.0)
    assert m.iqr_ms == pytest.approx(5.5 - 2.5)
    assert (m.ci_low_ms, m.ci_high_ms) == pytest.approx((1.0, 7.0))


def test_settling_is_a_warm_up_run_that_beats_every_run_before_it() -> None:
    assert settling([]) and settling([10.0])  # nothing to compare yet
    assert settling([10.0, 9.0])  # 10% faster than the best so far: still paying
    assert not settling([10.0, 9.6])  # within 5% of it: settled
    assert not settling([9.0, 12.0, 9.5])  # slower than the best: noise, not a cold step
    # a step that was getting faster needs two runs without progress
    assert settling([10.0, 9.0, 9.6]) and not settling([10.0, 9.0, 9.6, 9.4])
    assert settling([10.0, 9.0, 9.6, 8.0])  # a jittery run, then on getting faster


# A step that pays its one-time costs over its first runs (pages first touched, primitives
# created): 500 ms first call, then runs getting faster until they agree at 65 ms
COLD = [0.500, 0.300, 0.200, 0.140, 0.100, 0.080, 0.070, 0.066, 0.065, 0.065]
STEADY = [0.065, 0.064, 0.066, 0.065, 0.064, 0.066, 0.065]


def test_the_warm_up_goes_on_until_the_step_has_stopped_getting_faster() -> None:
    # Two warm-up runs (300 and 200 ms) would have let 140, 100, 80 ... into the samples: a
    # median of 80 ms for a 65 ms step (issue 56: the default's trial, the first measurement
    # of its workload in the process, read 3.5x its re-time)
    clock = FakeClock(COLD + STEADY + [0.065] * 50)
    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=7, max_samples=7,
                          target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
    m = measure(clock.step, CPU, policy, clock=clock)
    assert m.first_call_ms == pytest.approx(500.0)
    assert m.warmup_runs == len(COLD) - 1  # until two runs within 5% of the best before them
    assert m.samples_ms == pytest.approx([1e3 * d for d in STEADY])


def test_a_step_that_keeps_getting_faster_warms_up_within_a_measurement_s_time() -> None:
    clock = FakeClock([0.100 * 0.9**i for i in range(200)])  # 10% faster at every run
    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=3, max_samples=3,
                          max_time_s=0.5)  # fmt: skip
    m = measure(clock.step, CPU, policy, clock=clock)
    warm_s = sum(0.100 * 0.9**i for i in range(1, 1 + m.warmup_runs))
    assert 0.5 <= warm_s < 0.5 + 0.100  # stopped at the first run past max_time_s


def test_the_interleaved_sampler_s_warm_up_settles_each_step_on_a_cpu() -> None:
    def warmed(runs: int, device: torch.device) -> int:
        clock = FakeClock(COLD + STEADY)
        warm_up([clock.step], [lambda: None], runs, clock, device=device, settle_s=10)
        return clock.calls

    assert warmed(2, CPU) == len(COLD)  # the first call, then on until it has settled
    assert warmed(1, CPU) == 1  # one run asked for: the first call only, as before
    # a GPU's warm-up runs are launches (its step time is not on the host clock)
    assert warmed(2, torch.device("cuda")) == 2


def test_measure_stops_when_ci_is_tight() -> None:
    clock = FakeClock([0.002] * 1000)  # constant: the CI is zero after min_samples
    policy = TimingPolicy(
        warmup_runs=1,
        warmup_s=0.0,
        min_samples=5,
        max_samples=100,
        target_rel_ci=0.01,
        max_time_s=100,
    )
    m = measure(clock.step, CPU, policy, clock=clock)
    assert len(m.samples_ms) == 5
    assert m.ci_low_ms == m.ci_high_ms == 2.0  # its interval is within the target


def test_measure_stops_at_time_cap() -> None:
    # alternating 1 ms / 3 ms never gets a tight CI: the time cap ends it
    clock = FakeClock([0.001, 0.003] * 1000)
    policy = TimingPolicy(
        warmup_runs=0,
        warmup_s=0.0,
        min_samples=5,
        max_samples=1000,
        target_rel_ci=0.001,
        max_time_s=0.05,
    )
    m = measure(clock.step, CPU, policy, clock=clock)
    assert 5 <= len(m.samples_ms) <= 30
    assert sum(m.samples_ms) >= 50 - 3


def test_interleaved_rounds_rotate_so_that_no_sampler_follows_itself() -> None:
    """In one process a sample taken right after its own ran faster (warm memory): reversed
    rounds (A B C, C B A) gave that to the first and the last sampler only."""
    taken: list[int] = []
    clock = FakeClock([0.001])

    def sampler(i: int) -> Callable[[], float]:
        def one() -> float:
            taken.append(i)
            clock.step()
            return 1.0

        return one

    for n in (3, 4):
        taken.clear()
        out = interleave([sampler(i) for i in range(n)], clock, min_rounds=2 * n, max_rounds=2 * n)
        assert [len(s) for s in out] == [2 * n] * n
        assert all(a != b for a, b in zip(taken, taken[1:]))  # none follows itself
        rounds = [taken[r * n : (r + 1) * n] for r in range(2 * n)]
        for place in range(n):  # each takes every place, as often as the others
            assert sorted(r[place] for r in rounds) == sorted(list(range(n)) * 2)
    taken.clear()
    interleave([sampler(0), sampler(1)], clock, min_rounds=4, max_rounds=4)
    assert taken == [0, 1, 1, 0, 0, 1, 1, 0]  # two: each follows itself as often as the other


def test_median_ci_order_statistics() -> None:
    s = [float(i) for i in range(100)]
    lo, hi = median_ci(s)
    assert lo == pytest.approx(40.0) and hi == pytest.approx(59.0)
    assert all(math.isnan(v) for v in median_ci([]))


def test_measure_real_step_keeps_raw_samples() -> None:
    x = torch.randn(64, 64)
    m = measure(lambda: x @ x, CPU, TimingPolicy(min_samples=5, max_time_s=0.1))
    assert len(m.samples_ms) >= 5
    assert all(s > 0 for s in m.samples_ms)
    assert m.ci_low_ms <= m.median_ms <= m.ci_high_ms


def test_mann_whitney_and_clearly_faster() -> None:
    fast = Measurement(samples_ms=[1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0])
    slow = Measurement(samples_ms=[2.0, 2.1, 1.9, 2.0, 2.05, 1.95, 2.0])
    same = Measurement(samples_ms=[1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03])
    assert mann_whitney_p(fast.samples_ms, slow.samples_ms) < 0.01
    assert mann_whitney_p(fast.samples_ms, same.samples_ms) > 0.05
    assert clearly_faster(fast, slow)
    assert not clearly_faster(fast, same)
    assert not clearly_faster(slow, fast)
    ratio, lo, hi = speedup(slow, fast)
    assert ratio == pytest.approx(2.0)
    assert lo <= ratio <= hi


def test_a_short_step_is_repeated_back_to_back_within_a_sample() -> None:
    # 0.25 ms steps under a 1 ms sample floor: 4 calls per sample, reported per call; the flush
    # runs once before each sample, outside the timed span.
    clock = FakeClock([0.00025] * 10_000)
    flushes: list[int] = []
    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=5, max_samples=5,
                          target_rel_ci=1e-9, max_time_s=100, min_sample_ms=1.0)  # fmt: skip
    m = measure(clock.step, CPU, policy, clock=clock, flush=lambda: flushes.append(clock.calls))
    assert m.reps == 4
    assert m.samples_ms == pytest.approx([0.25] * 5)
    assert len(flushes) == 5
    assert clock.calls == 1 + 2 + 5 * 4  # first call, warm-up, 5 samples of 4 calls
    # a step longer than the floor: one call per sample; the floor off: one call too
    slow = FakeClock([0.002] * 100)
    assert measure(slow.step, CPU, policy, clock=slow).reps == 1
    assert reps_for(2.0, policy) == 1 and reps_for(0.001, policy) == policy.max_reps
    assert reps_for(0.1, TimingPolicy()) == 1


def test_trials_and_re_time_share_one_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-time samples with the same Sampler as the trials, each finalist with the calls per
    sample its trial used, under the device guard."""
    from advisor.execute import retime as retime_mod
    from advisor.knobs import Settings
    from advisor.measure.results import TrialResult
    from advisor.workload.build import layer_workload
    from advisor.workload.layer_spec import layer_spec

    seen: list[tuple[str, int]] = []
    real = retime_mod.Sampler.__call__

    def spy(self, fn, reps=1):  # noqa: ANN001, ANN202
        seen.append((type(self).__name__, reps))
        return real(self, fn, reps)

    guarded: list[str] = []
    real_guard = retime_mod.device_guard
    monkeypatch.setattr(retime_mod.Sampler, "__call__", spy)
    monkeypatch.setattr(
        retime_mod, "device_guard", lambda d: guarded.append(str(d)) or real_guard(d)
    )
    w = layer_workload(layer_spec("Conv2d(4, 8, 3)", input_shape="1,4,16,16"))
    rs = [
        TrialResult(settings=Settings(), status="ok", measurement=Measurement(samples_ms=[1.0], reps=3)),
        TrialResult(settings=Settings(memory_format="channels_last"), status="ok",
                    measurement=Measurement(samples_ms=[1.0], reps=1)),
    ]  # fmt: skip
    policy = TimingPolicy(warmup_runs=1, min_samples=3, max_samples=3, max_time_s=0.01)
    fresh = retime_mod.retime(w, rs, CPU, "infer", policy)
    assert guarded == ["cpu"]
    assert sorted(set(seen)) == [("Sampler", 1), ("Sampler", 3)]
    assert [r.measurement.reps for r in fresh] == [3, 1] and all(r.retimed for r in fresh)


def test_measure_runs_under_the_device_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    import advisor.measure.timing as timing

    entered: list[str] = []
    real = timing.device_guard
    monkeypatch.setattr(timing, "device_guard", lambda d: entered.append(str(d)) or real(d))
    measure(lambda: None, CPU, TimingPolicy(min_samples=3, max_samples=3))
    assert entered == ["cpu"]
    assert isinstance(real(CPU), contextlib.nullcontext)
