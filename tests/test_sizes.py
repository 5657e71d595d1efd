"""Absurd sizes and unparseable layer specs, in the API: one-line SpecErrors before anything is
allocated (the command-line side is in tests/hostile/test_sizes.py)."""

from __future__ import annotations

import pytest

import advisor
from advisor.errors import SpecError
from advisor.workload.layer_call import parse_layer_call
from advisor.workload.layer_spec import layer_spec
from advisor.workload.preflight import check_workload_sizes
from advisor.workload.sizes import format_bytes


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(2**40) == "1.0 TiB"
    assert format_bytes(2**70).endswith("EiB")


@pytest.mark.parametrize(
    "text",
    [
        "Conv2d(4, 4, " + "-" * 1000 + "3)",
        "Conv2d(4, 4, " + "-" * 9000 + "3)",
        "Conv2d(4, 4, " + "-" * 100_000 + "3)",
        "Conv2d(4, 4, " + "(" * 3000 + "3" + ")" * 3000 + ")",
        "Conv2d(4, 4, 3, dtype=" + "-" * 1000 + "x)",
        "Conv2d(4, 4, {[1]: 2})",
        "Conv2d(4, 4, 3\0)",
    ],
)
def test_any_layer_text_parses_or_is_a_spec_error(text: str) -> None:
    try:
        parse_layer_call(text)
    except SpecError as e:
        assert "\n" not in str(e) and len(str(e)) < 400
    # anything else (RecursionError, MemoryError, ValueError, TypeError) fails the test


def test_layer_spec_rejects_what_this_machine_cannot_hold() -> None:
    with pytest.raises(SpecError, match=r"input 4096x4x4096x4096 \(float32\) needs 1\.0 TiB"):
        layer_spec("Conv2d(4, 4, 3)", input_shape="4096,4,4096,4096")
    with pytest.raises(SpecError, match="does not fit in a 64-bit integer"):
        layer_spec("Conv2d(4, 4, 3)", input_shape=[1, 4, 8, 2**64])
    spec = layer_spec("Conv2d(4, 4, 3)", input_shape="1,4,8,8")
    assert [name for name, _, _ in spec.tensors()] == ["input", "weight", "output"]
    assert spec.tensors()[2][1] == (1, 4, 6, 6)


def test_shape_sets_are_checked_at_every_shape() -> None:
    with pytest.raises(SpecError, match=r"100000000000x3x8x8 \(float32\) needs"):
        check_workload_sizes(
            "cpu", layer="Conv2d(3, 4, 3)", input_shape="1,3,8,8", batch_sizes=[1, 10**11]
        )
    with pytest.raises(SpecError, match="batch size 100000000000"):
        check_workload_sizes("cpu", model_file="net.py", batch_sizes=[1, 10**11])
    check_workload_sizes("cpu", layer="Conv2d(3, 4, 3)", input_shape="1,3,8,8", batch_sizes=[2])


def test_advise_rejects_absurd_sizes_before_allocating() -> None:
    with pytest.raises(SpecError, match="TiB"):
        advisor.advise(layer="Conv2d(4, 4, 3)", input_shape="4096,4,4096,4096", device="cpu")


def test_on_cuda_the_device_memory_bounds_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from advisor.workload import sizes

    def limit(device: str | torch.device) -> tuple[int, str]:
        if torch.device(device).type == "cuda":
            return 2**30, "memory of Some GPU"
        return 2**40, "RAM"

    monkeypatch.setattr(sizes, "memory_limit", limit)
    sizes.check_tensor_fits("input", (1, 256, 1024, 1024), torch.float32, "cpu")  # 1 GiB: fits
    with pytest.raises(
        SpecError, match=r"input 2x256x1024x1024 .* 2\.0 GiB.*1\.0 GiB of memory of Some GPU"
    ):
        sizes.check_tensor_fits("input", (2, 256, 1024, 1024), torch.float32, "cuda")
