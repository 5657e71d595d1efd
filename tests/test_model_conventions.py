"""Models as people write them: keyword inputs (`example_inputs()` returning a dict), inputs that
are not tensors, bool and integer tensors, dataclass outputs, and shape sets over all of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import advisor
from advisor.errors import ModelFileError
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, flatten_tensors
from advisor.stages.layer_groups import conv_inputs
from advisor.workload.build import (
    model_workload,
    object_workload,
)
from advisor.workload.rebuild import workload_from_info
from advisor.workload.shape_sets import with_shape_set

DATA = Path(__file__).parent / "data"
KW = str(DATA / "kwargs_model.py")
FAST = str(DATA / "fast_cpu.yaml")
CPU = torch.device("cpu")


def test_a_dict_of_inputs_is_the_keyword_inputs() -> None:
    w = model_workload(KW)
    assert w.example_inputs == () and list(w.example_kwargs) == ["x", "scale", "mask"]
    assert w.input_shapes == [[2, 3, 16, 16], [2, 16, 16]]  # tensors only, in order
    args, kwargs = w.make_call(CPU, seed=3)
    assert args == () and kwargs["scale"] == 0.5  # not a tensor: passed through
    assert kwargs["mask"].dtype == torch.bool  # bool and integer tensors keep their values
    assert torch.equal(kwargs["mask"], w.example_kwargs["mask"])
    assert not torch.equal(kwargs["x"], w.example_kwargs["x"])  # floats: fresh random values
    assert torch.equal(kwargs["x"], w.make_call(CPU, seed=3)[1]["x"])  # ... from the seed
    out = w.make_model()(**kwargs)
    assert [t.shape for t in flatten_tensors(out)] == [(2, 8, 16, 16), (2, 4)]  # dataclass fields


def test_the_candidate_calls_with_keywords_records_convs_and_captures_gradients() -> None:
    w = model_workload(KW)
    cand = Candidate(w, Settings(memory_format="channels_last"), CPU, "train")
    try:
        assert cand.inputs == () and cand.kwargs["scale"] == 0.5
        assert cand.kwargs["x"].is_contiguous(memory_format=torch.channels_last)
        cand.step()
        cap = cand.capture(record_convs=True)
    finally:
        cand.close()
    assert len(cap.outputs) == 2 and "conv1.weight" in cap.grads
    seen = {c.name: c for c in cap.convs}
    assert set(seen) == {"conv1", "conv2"} and seen["conv1"].layout == "channels_last"
    recorded = conv_inputs(w, Settings(), CPU, "train")  # what the per-layer stage records
    assert recorded["conv2"].shape == (2, 8, 16, 16)


def test_a_float64_reference_casts_keyword_tensors_only() -> None:
    cand = Candidate(model_workload(KW), Settings(), CPU, "infer", dtype=torch.float64)
    try:
        assert cand.kwargs["x"].dtype == torch.float64
        assert cand.kwargs["mask"].dtype == torch.bool and cand.kwargs["scale"] == 0.5
        cand.step()
    finally:
        cand.close()


# isolated: a probe and a worker (3.4 s), in the slow run
@pytest.mark.parametrize(
    "isolate", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in_process", "isolated"]
)
def test_a_keyword_model_tunes_end_to_end(isolate: bool) -> None:
    advice = advisor.advise(
        model_file=KW, mode="train", device="cpu", space=FAST, trials=2, isolate=isolate
    )
    default = [r for r in advice.results if r.settings == Settings()]
    assert default and default[0].status == "ok", default and default[0].reason
    r = default[0]  # the numeric gate passed it: exactly the reference's computation
    assert r.rel_error is not None and r.rel_error <= r.tolerance
    assert r.grad_error is not None and r.grad_tolerance and r.grad_error <= r.grad_tolerance
    assert advice.config.workload["input_shapes"] == [[2, 3, 16, 16], [2, 16, 16]]


def test_a_shape_set_over_a_dict_input() -> None:
    w = with_shape_set(model_workload(KW), batch_sizes=[1, 3], weights=[1, 2])
    first, second = w.shape_cases
    assert first.inputs == () and first.kwargs["x"].shape == (1, 3, 16, 16)
    assert second.kwargs["x"].shape == (3, 3, 16, 16)
    mask = second.kwargs["mask"]
    assert mask.shape == (3, 16, 16) and mask.dtype == torch.bool
    example = model_workload(KW).example_kwargs["mask"]
    assert torch.equal(mask[:2], example) and torch.equal(mask[2], example[0])  # values repeated
    assert second.kwargs["scale"] == 0.5
    assert w.info.shape_set is not None
    assert w.info.shape_set.input_shapes == [
        [[1, 3, 16, 16], [1, 16, 16]],
        [[3, 3, 16, 16], [3, 16, 16]],
    ]
    again = workload_from_info(w.info)  # what an isolated worker rebuilds
    assert [c.kwargs["x"].shape for c in again.shape_cases] == [(1, 3, 16, 16), (3, 3, 16, 16)]
    _, kwargs = w.make_call(CPU, case=1)
    assert kwargs["x"].shape == (3, 3, 16, 16)


def test_advise_over_batch_sizes_with_keyword_inputs() -> None:
    advice = advisor.advise(
        model_file=KW, batch_sizes=[1, 3], mode="infer", device="cpu", space=FAST, trials=2
    )
    ok = [r for r in advice.results if r.status == "ok"]
    assert ok and all(r.per_shape and len(r.per_shape) == 2 for r in ok)


class _Tagger(nn.Module):
    """Positional inputs of every kind: a float image, integer ids, a string, a per-channel
    tensor that has no batch dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.emb = nn.Embedding(10, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, how: str, gain: torch.Tensor) -> dict:
        assert how == "sum" and gain.shape == (4,)
        h = self.conv(x).mean((2, 3)) * gain
        return {"y": h + self.emb(ids).sum(1), "ids": ids}


def test_integer_inputs_and_unbatched_tensors_in_a_shape_set() -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 9]])
    base = object_workload(_Tagger(), (torch.randn(2, 3, 8, 8), ids, "sum", torch.rand(4)))
    w = with_shape_set(base, batch_sizes=[4, 1])
    big = w.shape_cases[0].inputs
    assert big[0].shape == (4, 3, 8, 8) and big[2] == "sum" and big[3].shape == (4,)
    assert torch.equal(big[1], torch.cat([ids, ids]))  # ids kept: repeated to the new batch
    args, _ = w.make_call(CPU, case=0)
    assert torch.equal(args[1], big[1])


def test_the_python_api_takes_a_dict_of_inputs() -> None:
    from tests.data.kwargs_model import MaskedNet

    x, mask = torch.randn(2, 3, 8, 8), torch.rand(2, 8, 8) > 0.5
    w = object_workload(MaskedNet(), {"x": x, "scale": 2.0, "mask": mask})
    assert w.example_inputs == () and w.info.input_shapes == [[2, 3, 8, 8], [2, 8, 8]]


@pytest.mark.parametrize(
    "inputs,needle",
    [
        ("not_inputs", "must return a tensor, a tuple of positional inputs or a dict"),
        ("bad_keys", "keys are not argument names: 0"),
        ("wrong_mask", "fails on wrong_mask() [(2, 3, 16, 16), (2, 8, 8)]"),
    ],
)
def test_bad_inputs_are_one_line(inputs: str, needle: str) -> None:
    with pytest.raises(ModelFileError) as e:
        model_workload(KW, inputs=inputs)
    assert needle in str(e.value) and "\n" not in str(e.value)
