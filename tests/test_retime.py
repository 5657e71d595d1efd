"""Interleaved re-timing of the finalists."""

import torch

from advisor.execute.retime import finalists, retime
from advisor.knobs import GlobalFlags, Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.timing import TimingPolicy
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from advisor.workload.shape_sets import with_shape_set

CPU = torch.device("cpu")


def _r(settings: Settings, ms: float, status: str = "ok") -> TrialResult:
    return TrialResult(
        settings=settings, status=status, measurement=Measurement(samples_ms=[ms] * 5)
    )


def test_finalists_are_the_fastest_accepted_that_could_win_plus_the_baseline() -> None:
    base = _r(Settings(), 10.0)
    rs = [
        base,
        _r(Settings(amp="bf16"), 5.0),
        _r(Settings(memory_format="channels_last"), 7.0),
        _r(Settings(amp="bf16", memory_format="channels_last"), 1.0, "rejected"),
        _r(Settings(conv_impl="unfold_gemm"), 9.0),
    ]
    # constant samples: only the fastest could win; the baseline always takes part
    got = finalists(rs, base, top=2)
    assert [r.median_ms for r in got] == [5.0, 10.0]
    # with overlapping intervals the next ones could still win, up to `top`
    wide = [
        TrialResult(settings=r.settings, status=r.status,
                    measurement=Measurement(samples_ms=[r.median_ms * f for f in (0.5, 1, 1.5)]))
        for r in rs
    ]  # fmt: skip
    got = finalists(wide, wide[0], top=2)
    assert [r.median_ms for r in got] == [5.0, 7.0, 10.0]
    assert finalists(wide, wide[0], top=5)[-1] is wide[0]  # not added twice


def test_retime_interleaves_fresh_samples_and_restores_flags() -> None:
    w = with_shape_set(
        layer_workload(layer_spec("Conv2d(4, 8, 3)", input_shape="1,4,16,16")),
        batch_sizes=[1, 2],
        weights=[1, 3],
    )
    before = GlobalFlags.read()
    rs = [
        _r(Settings(), 1.0),
        _r(Settings(memory_format="channels_last", cudnn_benchmark=True), 1.0),
    ]
    policy = TimingPolicy(warmup_runs=1, min_samples=5, max_samples=8, max_time_s=0.05)
    fresh = retime(w, rs, CPU, "train", policy)
    assert GlobalFlags.read() == before
    for old, new in zip(rs, fresh, strict=True):
        assert new.settings == old.settings
        assert new.per_shape is not None and len(new.per_shape) == 2
        # one sample per round for every finalist: equal counts
        assert len(new.per_shape[0].samples_ms) == len(fresh[0].per_shape[0].samples_ms)
        assert 5 <= len(new.measurement.samples_ms) <= 8
        assert new.measurement.samples_ms != old.measurement.samples_ms


def _spread(settings: Settings, ms: float, rel: float) -> TrialResult:
    samples = [ms * (1 + rel * f) for f in (-1, -0.5, 0, 0.5, 1) * 3]
    return TrialResult(settings=settings, status="ok", measurement=Measurement(samples_ms=samples))


def test_a_pick_the_search_settled_is_not_re_timed_before_the_later_stages() -> None:
    from advisor.device.environment import current_environment
    from advisor.search import SearchOutcome
    from advisor.space import SearchSpace
    from advisor.stages.finalists import settled

    space = SearchSpace(name="s", knobs={})
    cl_bf16 = Settings(memory_format="channels_last", amp="bf16")

    def outcome(results: list[TrialResult]) -> SearchOutcome:
        return SearchOutcome(results, results[0], [], "s", current_environment(CPU), 0.0)

    # small_cnn train on a 2-core CPU: channels_last + bf16 at 19.5 ms, the next at 28.2 ms
    clear = [_spread(Settings(), 38.0, 0.02), _spread(Settings(amp="bf16"), 28.2, 0.05),
             _spread(cl_bf16, 19.5, 0.02)]  # fmt: skip
    assert settled(outcome(clear), space)
    # a runner-up whose interval reaches the leader's: a re-time could change the pick
    close = [*clear, _spread(Settings(memory_format="channels_last"), 20.0, 0.05)]
    assert not settled(outcome(close), space)
    # the default itself within reach of the leader
    near = [_spread(Settings(), 20.2, 0.05), _spread(cl_bf16, 19.5, 0.02)]
    assert not settled(outcome(near), space)
    # the default fastest: nothing to re-time before the later stages either way
    assert not settled(outcome([_spread(Settings(), 10.0, 0.01), _spread(cl_bf16, 19.5, 0.02)]),
                       space)  # fmt: skip
    # re-times turned off in the space
    assert not settled(outcome(clear), SearchSpace(name="s", knobs={}, retime_top=0))


def test_a_compiled_finalist_is_re_timed_with_the_fastest_eager_candidate() -> None:
    # MobileNetV3-Small infer: the compiled twin (6.55 ms) left the per-layer pick (6.93 ms)
    # out of the finalists, and its bill then compared the two across time windows.
    base = _r(Settings(), 9.3)
    pick = _r(Settings(memory_format="channels_last", layers={"0": "unfold_gemm"}), 6.93)
    compiled = _r(Settings(memory_format="channels_last", compile="default"), 6.55)
    got = finalists([base, pick, compiled], base, top=3)
    assert got == [compiled, pick, base]
    # without a compiled finalist the rule is as before
    assert finalists([base, pick], base, top=3) == [pick, base]


def test_after_the_compile_stage_the_eager_candidates_it_ranked_below_its_pick_are_not_re_timed() -> None:
    # small_cnn train: the per-layer combination tied with the eager pick (a simpler one won),
    # and was re-timed again beside the compiled candidate, about 1 s of rounds for nothing.
    from advisor.search.pick import pick_final
    from advisor.stages.finalists import after_compile

    wide = (0.94, 0.96, 0.98, 1.0, 1.02, 1.04, 1.06)  # the three fastest overlap
    def r(settings: Settings, ms: float) -> TrialResult:
        return TrialResult(settings=settings, status="ok",
                           measurement=Measurement(samples_ms=[ms * f for f in wide]))  # fmt: skip

    base = r(Settings(), 36.0)
    pick = r(Settings(memory_format="channels_last", amp="bf16"), 16.7)
    combo = r(Settings(memory_format="channels_last", amp="bf16", layers={"9": "unfold_gemm"}), 17.3)
    eager = pick_final([base, pick, combo], base)
    assert eager.chosen is pick and eager.fastest is pick
    compiled = r(Settings(memory_format="channels_last", amp="bf16", compile="default"), 16.1)
    assert finalists([base, pick, combo, compiled], base, top=3) == [compiled, pick, combo, base]
    pool = after_compile(eager, [compiled])
    assert pool == [compiled, pick]
    assert finalists(pool, base, top=3) == [compiled, pick, base]
