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
