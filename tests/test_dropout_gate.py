"""Dropout in train mode: the gate compares precisions and layouts, not two dropout masks
(gpu_audit #5). PyTorch draws masks in memory order (and, on CUDA, with a dtype-dependent vector
width), so a channels_last candidate dropped other units than the fp32 reference, here on a CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advisor.gate.numeric import REFERENCE, Gate, compare
from advisor.knobs import Settings
from advisor.measure.canonical_dropout import canonical_dropout
from advisor.space import SearchSpace
from advisor.workload.args import make_workload
from tests.conftest import capture_on_cpu


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

    def capture(settings: Settings):  # noqa: ANN202
        return capture_on_cpu(workload, settings)

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


@pytest.mark.slow
def test_a_compiled_model_with_in_place_dropout_trains_under_the_canonical_masks() -> None:
    """Around a compiled model the mode drew its mask where Dynamo cannot trace (a graph break):
    the backward then failed ("modified by an inplace operation ... CopyBackwards") where
    torch.compile alone trains. It draws the eager masks now, and the model trains."""
    torch.manual_seed(0)
    # MobileNetV3's classifier up to its dropout, whose output shows the mask
    model = nn.Sequential(
        nn.Linear(16, 32), nn.Hardswish(inplace=True), nn.Dropout(0.5, inplace=True)
    ).train()
    x, w = torch.randn(8, 16), torch.randn(8, 32)

    def step(run: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor], int]:
        model.zero_grad(set_to_none=True)
        with canonical_dropout(0) as mode:
            out = run(x)
        (out * w).sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()], mode.calls

    out, grads, calls = step(model)
    cout, cgrads, ccalls = step(torch.compile(model))  # type: ignore[arg-type]
    assert calls == ccalls == 1
    assert 0.3 < float((out == 0).float().mean()) < 0.7  # p=0.5 drops about half
    assert torch.equal(cout == 0, out == 0)  # the same units dropped
    torch.testing.assert_close(cout, out)
    for g, cg in zip(grads, cgrads, strict=True):
        torch.testing.assert_close(cg, g)


def _eager_masks_without_dynamo() -> None:
    """In a fresh process: canonical masks in an eager step, then the same call traced, whose op
    gives the same mask."""
    import sys

    x = torch.ones(2, 4, 3, 3)
    with canonical_dropout(7):
        eager = nn.functional.dropout(x, 0.5, training=True)
    assert "torch._dynamo" not in sys.modules, "an eager mask imported Dynamo"

    def step(t: torch.Tensor) -> torch.Tensor:
        with canonical_dropout(7):
            return nn.functional.dropout(t, 0.5, training=True)

    traced = torch.compile(step, backend="eager", fullgraph=True)(x)
    assert torch.equal(eager, traced)


def test_an_eager_mask_does_not_import_dynamo_and_matches_the_traced_op() -> None:
    """The custom op that keeps the mask one node of a compiled graph imports Dynamo at its first
    call (about 1.4 s of a process on a 2-core CPU: the probe's step on a model with dropout):
    eager steps draw the mask without it, the same mask."""
    from tests.conftest import in_fresh_process

    in_fresh_process(_eager_masks_without_dynamo)
