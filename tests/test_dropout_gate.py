"""Dropout in train mode: the gate compares precisions and layouts, not two dropout masks
(gpu_audit #5). PyTorch draws masks in memory order (and, on CUDA, with a dtype-dependent vector
width), so a channels_last candidate dropped other units than the fp32 reference, here on a CPU."""

from __future__ import annotations

import torch
from torch import nn

from advisor.gate.numeric import REFERENCE, Gate, compare
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.space import SearchSpace
from advisor.workload.args import make_workload


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Dropout2d(0.2),  # channel-wise, on a 4-D activation
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Dropout(0.3),  # elementwise, on a 4-D activation: memory order matters
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
        nn.AlphaDropout(0.1),
    )


def test_channels_last_and_bf16_drop_the_same_units_as_the_reference() -> None:
    workload = make_workload(model=_net(), inputs=(torch.randn(4, 3, 8, 8),))
    cpu = torch.device("cpu")

    def capture(settings: Settings):  # noqa: ANN202
        cand = Candidate(workload, settings, cpu, "train", seed=0)
        try:
            return cand.capture()
        finally:
            cand.close()

    ref = capture(REFERENCE)
    cl = compare(capture(Settings(memory_format="channels_last")), ref, "train")
    assert cl.out < 1e-5 and (cl.grad or 0.0) < 1e-4, cl  # an exact reordering: fp32 noise
    bf16 = compare(capture(Settings(amp="bf16")), ref, "train")
    assert bf16.out < 2e-2 and (bf16.grad or 0.0) < 1e-1, bf16  # bf16 rounding, not a mask
    again = compare(capture(REFERENCE), ref, "train")
    assert again.out == 0.0  # the masks depend on the seed only: the same draw twice


def test_the_noise_floor_is_not_made_of_dropout_masks() -> None:
    workload = make_workload(model=_net(), inputs=(torch.randn(4, 3, 8, 8),))
    space = SearchSpace.model_validate({"name": "s", "knobs": {}})
    gate = Gate(workload, torch.device("cpu"), "train", space)
    noise = gate.noise()  # float64 and perturbed-input fp32 references against the reference
    assert noise.out < 1e-4 and (noise.grad or 0.0) < 1e-3, noise
