"""Models that draw from Python's `random` or NumPy in train mode (transformers' SpecAugment picks
its masked frames with `np.random`): the gate's captures and the training check's calls draw the
same there in every candidate, and the user's own streams go on as if the gate had not run."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from advisor.apply import apply_settings
from advisor.gate.numeric import REFERENCE, compare
from advisor.gate.training import call_model
from advisor.knobs import Settings
from advisor.measure.seeded import seeded
from advisor.workload.args import make_workload
from tests.conftest import capture_on_cpu


class HostDrawn(nn.Module):
    """A conv net that masks time steps picked by NumPy and scales by a factor from `random`,
    in training only, as SpecAugment and LayerDrop-style code do."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.head = nn.Conv1d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if self.training:
            keep = torch.from_numpy(np.random.rand(h.shape[-1]) > 0.3).to(h.dtype)
            h = h * keep * (0.5 + random.random())
        return self.head(torch.relu(h))


def _workload():  # noqa: ANN202
    torch.manual_seed(0)
    return make_workload(model=HostDrawn(), inputs=(torch.randn(2, 4, 32),))


def test_the_same_candidate_captured_twice_is_the_same_step() -> None:
    workload = _workload()

    def capture(settings: Settings):  # noqa: ANN202
        return capture_on_cpu(workload, settings, seed=3)

    ref = capture(REFERENCE)
    again = compare(capture(REFERENCE), ref, "train")
    assert again.out == 0.0 and again.grad == 0.0, again
    # a real change is still measured as itself: fp32 reordering noise, not a different mask
    cl = compare(capture(Settings(memory_format="channels_last")), ref, "train")
    assert cl.out < 1e-5, cl


def test_the_training_checks_calls_repeat_under_one_seed() -> None:
    workload = _workload()
    tuned = apply_settings(REFERENCE, workload.make_model(), torch.device("cpu"), warn=False)
    try:
        args, kwargs = workload.make_call(torch.device("cpu"), 0)
        with torch.no_grad():
            first = call_model(tuned, args, kwargs, 0.0, seed=5)
            second = call_model(tuned, args, kwargs, 0.0, seed=5)
            other = call_model(tuned, args, kwargs, 0.0, seed=6)
    finally:
        tuned.restore()
    assert torch.equal(first[0], second[0])
    assert not torch.equal(first[0], other[0])  # the seed decides the draws: they are drawn


def test_the_users_streams_are_put_back() -> None:
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    expected = (random.random(), np.random.rand(), torch.rand(()).item())
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    with seeded(7):
        inside = (random.random(), np.random.rand(), torch.rand(()).item())
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == expected
    with seeded(7):
        assert (random.random(), np.random.rand(), torch.rand(()).item()) == inside
    # keep_torch: the caller owns torch's generator, which is seeded and left as drawn
    with seeded(7, keep_torch=True):
        torch.rand(())
    assert torch.rand(()).item() == torch.rand((2,), generator=torch.Generator().manual_seed(7))[1]
