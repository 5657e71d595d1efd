"""Interleaved re-timing of the finalists."""

import torch

from advisor.execute.retime import retime
from advisor.knobs import GlobalFlags, Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.stopping import TimingPolicy
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from advisor.workload.shape_sets import with_shape_set

CPU = torch.device("cpu")


def _r(settings: Settings, ms: float, status: str = "ok") -> TrialResult:
    return TrialResult(
        settings=settings, status=status, measurement=Measurement(samples_ms=[ms] * 5)
    )


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


def test_after_the_compile_stage_the_eager_candidates_it_ranked_below_its_pick_are_not_re_timed() -> None:
    # small_cnn train: the per-layer combination tied with the eager pick (a simpler one won),
    # and was re-timed again beside the compiled candidate, about 1 s of rounds for nothing.
    from advisor.measure.contest import Contest
    from advisor.search.pick import decide
    from advisor.stages.finalists import after_compile

    wide = (0.94, 0.96, 0.98, 1.0, 1.02, 1.04, 1.06)  # the three fastest overlap
    def r(settings: Settings, ms: float) -> TrialResult:
        return TrialResult(settings=settings, status="ok",
                           measurement=Measurement(samples_ms=[ms * f for f in wide]))  # fmt: skip

    base = r(Settings(), 36.0)
    pick = r(Settings(memory_format="channels_last", amp="bf16"), 16.7)
    combo = r(Settings(memory_format="channels_last", amp="bf16", layers={"9": "unfold_gemm"}), 17.3)
    eager = decide([base, pick, combo], base, Contest())
    assert eager.chosen is pick and eager.fastest is pick
    compiled = r(Settings(memory_format="channels_last", amp="bf16", compile="default"), 16.1)
    assert Contest().finalists([base, pick, combo, compiled], base, top=3) == [compiled, pick, combo, base]
    pool = after_compile(eager, [compiled])
    assert pool == [compiled, pick]
    assert Contest().finalists(pool, base, top=3) == [compiled, pick, base]
