"""On a GPU a whole step's samples are taken in batches (`Sampler.batch`): one untimed call and
one synchronisation per batch, not per sample. An H200 run of the bundled example paid an
untimed call for every sample: half of its sampling time. Through the CUDA stand-in
(tests/standins/cuda_on_cpu.py: events read the host clock), this checks the calls a
measurement makes and what it keeps, not speed."""

from __future__ import annotations

import pytest
import torch

from advisor.measure.stats import Measurement, Race
from advisor.measure.stopping import BATCH_MS, MAX_BATCH, TimingPolicy, batch_size
from advisor.measure.timing import measure

POLICY = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=40, max_samples=40,
                      target_rel_ci=0.0, max_time_s=30.0, min_sample_ms=0.0)  # fmt: skip


def _counted_step() -> tuple[list[int], object]:
    a = torch.randn(160, 160)
    calls = [0]

    def step() -> None:
        calls[0] += 1
        a @ a  # noqa: B018 - real work, about a millisecond's tenth on a CPU

    return calls, step


@pytest.mark.usefixtures("cuda_standin")
def test_a_gpu_step_s_samples_cost_one_untimed_call_a_batch_not_one_a_sample() -> None:
    calls, step = _counted_step()
    m = measure(step, torch.device("cuda"), POLICY)  # type: ignore[arg-type]
    assert len(m.samples_ms) == 40 and all(ms > 0 for ms in m.samples_ms)
    sampled = calls[0] - 1 - m.warmup_runs  # after the first call and the warm-up
    # 40 kept, an untimed call a batch, and the rest of the batch the 40th sample stopped
    assert 40 < sampled < 40 + MAX_BATCH + 8, sampled  # a sample at a time took 80 calls
    assert m.warmup_s is not None and m.sampling_s is not None and m.sampling_s > 0


def test_a_cpu_step_is_sampled_one_call_a_sample() -> None:
    calls, step = _counted_step()
    m = measure(step, torch.device("cpu"), POLICY)  # type: ignore[arg-type]
    assert calls[0] == 1 + m.warmup_runs + len(m.samples_ms)
    assert m.sampling_s is not None and m.sampling_s > 0


def test_a_batch_fills_its_span_at_the_median_so_far() -> None:
    assert batch_size([], 1) == 1  # one sample first: the step's time is not known yet
    assert batch_size([20.0, 22.0, 19.0], 1) == int(BATCH_MS / 20.0)
    assert batch_size([0.5], 1) == MAX_BATCH
    assert batch_size([50.0], 4) == 1  # a sample of 4 calls spans 200 ms: one at a time


@pytest.mark.usefixtures("cuda_standin")
def test_a_race_stops_within_the_batch_and_keeps_no_sample_after_it() -> None:
    calls, step = _counted_step()
    # a limit no sample can beat: the sign test stops it at its fifth sample
    race = Race(limit_ms=1e-9)
    m = measure(step, torch.device("cuda"), POLICY, race=race)  # type: ignore[arg-type]
    assert m.stop == "raced"
    assert len(m.samples_ms) < 40
    assert isinstance(m, Measurement)
