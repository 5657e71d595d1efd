"""How samples and peak memory are taken on a GPU, driven on a CPU through the CUDA stand-in
(tests/standins/cuda_on_cpu.py): control flow, not speed (gpu_audit #6, #7, #9, #12)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advisor.execute.runner import evaluate
from advisor.gate.numeric import Gate
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import Sampler, measure
from advisor.space import SearchSpace
from advisor.workload.args import make_workload
from tests.conftest import DATA

CUDA = torch.device("cuda")
QUICK = {"warmup_runs": 1, "warmup_s": 0.0, "min_samples": 3, "max_samples": 3, "max_time_s": 0.2}


def _space(**extra: object) -> SearchSpace:
    return SearchSpace.model_validate({"name": "s", "knobs": {}, "timing": QUICK, **extra})


@pytest.mark.usefixtures("cuda_standin")
def test_a_whole_step_sample_starts_behind_an_untimed_call() -> None:
    # At one call per sample, the timed call started on an idle GPU: the host's latency to its
    # first launch was inside every sample (#9). One untimed call is queued first.
    calls: list[str] = []
    sampler = Sampler(CUDA)
    sampler(lambda: calls.append("step"), reps=2)
    assert calls == ["step"] * 3


@pytest.mark.usefixtures("cuda_standin")
def test_every_call_of_a_per_layer_sample_starts_from_a_cold_l2() -> None:
    # With several calls per sample, only the first call used to follow a flush (#9).
    calls: list[str] = []
    sampler = Sampler(CUDA, flush=lambda: calls.append("flush"), queue_ahead=True)
    ms = sampler(lambda: calls.append("layer"), reps=3)
    assert calls == ["flush", "layer"] * 3 and ms >= 0.0


@pytest.mark.usefixtures("cuda_standin")
def test_a_per_layer_fp16_training_step_does_not_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    # GradScaler.step reads found-Inf on the host; a per-layer sample queues its calls ahead of a
    # busy GPU, so a sync in the step made it time host launches (#6).
    synced: list[int] = []
    real = torch.amp.GradScaler._maybe_opt_step

    def spy(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        synced.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "_maybe_opt_step", spy)
    workload = make_workload(layer="Conv2d(8, 8, 3, padding=1)", input_shape="2,8,16,16")
    cand = Candidate(workload, Settings(amp="fp16"), CUDA, "train")
    try:
        weight = cand.tuned.model.weight.detach().clone()
        cand.step()
        cand.tuned.scaler.update(2.0**120)  # every step overflows, as early fp16 steps can
        measure(cand.step, CUDA, TimingPolicy(**QUICK))
        assert synced == []
        torch.testing.assert_close(cand.tuned.model.weight.detach(), weight)  # no NaN written
        cand.capture()  # the numeric gate's step is the real one, sync included
        assert synced
    finally:
        cand.close()


@pytest.mark.usefixtures("cuda_standin")
def test_peak_memory_leaves_out_the_harness_and_the_first_call(tmp_path: Path) -> None:
    # The L2 flush buffer (64 MiB here) and a first call's one-off 256 MiB buffer (Triton's
    # autotuner, cuDNN's benchmark search) were counted as the candidate's peak (#7).
    space = _space()
    layer = make_workload(layer="Conv2d(4, 4, 3, padding=1)", input_shape="1,4,8,8")
    r = evaluate(layer, Settings(), CUDA, "infer", space, Gate(layer, CUDA, "infer", space))
    assert r.status == "ok" and r.peak_memory_mb is not None and r.peak_memory_mb < 32
    model = make_workload(model_file=str(DATA / "big_first_call.py"))
    r = evaluate(model, Settings(), CUDA, "infer", space, Gate(model, CUDA, "infer", space))
    assert r.status == "ok", r.reason
    assert r.first_call_peak_mb is not None and r.first_call_peak_mb > 200
    assert r.peak_memory_mb is not None and r.peak_memory_mb < 100


@pytest.mark.usefixtures("cuda_standin")
def test_per_layer_check_inputs_are_drawn_alike_for_every_candidate() -> None:
    # Drawn on the device now (#12): still the same values for every candidate, so the float64
    # reference computed for the first candidate serves the next ones.
    space = _space()
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    gate = Gate(workload, CUDA, "train", space)
    verdicts = []
    for settings in (Settings(), Settings(memory_format="channels_last")):
        cand = Candidate(workload, settings, CUDA, "train")
        try:
            verdicts.append(gate.check_layers(cand, cand.capture(record_convs=True).convs))
        finally:
            cand.close()
    assert all(v is not None and v.ok for v in verdicts)
    assert len(gate.layers._layer_refs) == 3  # one reference per conv layer, reused


@pytest.mark.usefixtures("cuda_standin")
def test_per_layer_check_inputs_are_drawn_where_the_layer_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A CPU generator's draw (and its copy) of a large layer's input and output gradient cost
    # seconds per candidate on a GPU (#12): drawn with a generator on the layer's device now,
    # and the float64 references get a GPU-sized cache.
    from advisor.device.ops import cuda_ops, placement
    from advisor.gate import layer as layer_check

    devices: list[object] = []
    real = torch.Generator

    def recording(device: object = "cpu") -> torch.Generator:
        devices.append(torch.device(device))
        return real(device=device)

    workload = make_workload(layer="Conv2d(4, 4, 3, padding=1)", input_shape="2,4,8,8")
    gate = Gate(workload, CUDA, "train", _space())
    cand = Candidate(workload, Settings(), CUDA, "train")
    try:
        convs = cand.capture(record_convs=True).convs
        monkeypatch.setattr(layer_check.torch, "Generator", recording)
        verdict = gate.check_layers(cand, convs)
    finally:
        cand.close()
    assert verdict is not None and verdict.ok
    assert devices == [placement(CUDA)]
    total = cuda_ops().properties(0).total_memory
    assert gate.layers._cache_bytes == min(2 * 2**30, int(0.025 * total))
