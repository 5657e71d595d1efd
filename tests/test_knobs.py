from collections.abc import Iterator

import pytest
import torch

from advisor.apply import apply_settings
from advisor.knobs import KNOBS, GlobalFlags, Settings, amp_why_not, precision_of


def _flags() -> dict:
    return GlobalFlags.read()


@pytest.mark.parametrize("tf32", ["off", "conv", "on"])
@pytest.mark.parametrize("bench", [False, True])
def test_global_flags_apply_and_restore(tf32: str, bench: bool) -> None:
    before = _flags()
    with GlobalFlags() as flags:
        flags.apply(Settings(tf32=tf32, cudnn_benchmark=bench))
        now = _flags()
        assert now["cudnn_benchmark"] is bench
        assert torch.backends.cudnn.benchmark is bench
        conv, matmul = now["tf32"]["conv"], now["tf32"]["matmul"]
        assert conv in ("tf32", True) if tf32 != "off" else conv in ("ieee", False)
        assert matmul in ("tf32", True) if tf32 == "on" else matmul in ("ieee", False)
    assert _flags() == before


def test_flags_use_one_tf32_api_only() -> None:
    # Reading the legacy API after writing the new one raises in recent PyTorch: never mixed.
    with GlobalFlags() as flags:
        flags.apply(Settings(tf32="on"))
        GlobalFlags.read()
    GlobalFlags.read()


@pytest.fixture
def _matmul_precision_restored() -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.usefixtures("_matmul_precision_restored")
def test_matmul_tf32_follows_every_writer() -> None:
    assert GlobalFlags.matmul_tf32() is False  # PyTorch's default: IEEE fp32 matmuls
    for precision, want in (("high", True), ("medium", True), ("highest", False)):
        torch.set_float32_matmul_precision(precision)
        assert GlobalFlags.matmul_tf32() is want, precision
    torch.set_float32_matmul_precision("high")
    with GlobalFlags() as flags:
        for tf32, want in (("off", False), ("conv", False), ("on", True)):
            flags.apply(Settings(tf32=tf32))  # new API after the legacy entry point: no raise
            assert GlobalFlags.matmul_tf32() is want, tf32
    assert GlobalFlags.matmul_tf32() is True  # the user's "high" is back


@pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"), reason="no fp32_precision API in this torch"
)
def test_matmul_tf32_inherits_the_generic_precision() -> None:
    # A matmul value of "none" has none of its own: the generic value above it is in force.
    matmul = torch.backends.cuda.matmul
    saved = (torch.backends.fp32_precision, matmul.fp32_precision)
    try:
        matmul.fp32_precision = "none"
        torch.backends.fp32_precision = "tf32"
        assert GlobalFlags.matmul_tf32() is True
        matmul.fp32_precision = "ieee"  # a value of its own wins over the parent's
        assert GlobalFlags.matmul_tf32() is False
        matmul.fp32_precision = "none"
        torch.backends.fp32_precision = "none"
        assert GlobalFlags.matmul_tf32() is False
    finally:
        torch.backends.fp32_precision, matmul.fp32_precision = saved


def test_settings_defaults_are_pytorch_defaults() -> None:
    s = Settings()
    assert s.changes() == {}
    assert s.label() == "default"
    assert Settings(memory_format="channels_last_3d").memory_format == "channels_last"
    assert Settings(amp="bf16", cudnn_benchmark=True).changes() == {
        "amp": "bf16",
        "cudnn_benchmark": True,
    }


def test_cuda_only_knobs_not_applicable_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert KNOBS["tf32"].why_not(cpu)
    assert KNOBS["cudnn_benchmark"].why_not(cpu)
    assert KNOBS["memory_format"].why_not(cpu) is None
    assert KNOBS["amp"].why_not(cpu) is None
    # fp16 runs on a CPU (slowly): the built-in cpu space leaves it out, a space may list it
    assert amp_why_not("fp16", cpu) is None
    assert amp_why_not("bf16", cpu) is None


def test_precision_of() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision_of(Settings(), cpu) == "fp32"
    assert precision_of(Settings(), cuda) == "tf32"
    assert precision_of(Settings(tf32="off"), cuda) == "fp32"
    assert precision_of(Settings(amp="bf16"), cpu) == "bf16"


def test_apply_settings_converts_layout_and_autocasts() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 1))
    before = _flags()
    tuned = apply_settings(Settings(memory_format="channels_last", amp="bf16"), model, "cpu")
    try:
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
        (x,) = tuned.inputs(torch.randn(2, 3, 8, 8))
        assert x.is_contiguous(memory_format=torch.channels_last)
        with tuned.autocast():
            y = tuned.model(x)
        assert y.dtype == torch.bfloat16
        assert tuned.scaler is None
    finally:
        tuned.restore()
    assert _flags() == before


def test_apply_settings_conv3d_uses_channels_last_3d() -> None:
    model = torch.nn.Conv3d(2, 2, 3)
    with apply_settings(Settings(memory_format="channels_last"), model, "cpu") as tuned:
        assert model.weight.is_contiguous(memory_format=torch.channels_last_3d)
        (x,) = tuned.inputs(torch.randn(1, 2, 4, 6, 6))
        assert x.is_contiguous(memory_format=torch.channels_last_3d)


def test_fp16_training_gets_a_grad_scaler() -> None:
    with apply_settings(Settings(amp="fp16"), torch.nn.Conv2d(1, 1, 1), "cpu") as tuned:
        assert isinstance(tuned.scaler, torch.amp.GradScaler)
    with apply_settings(Settings(amp="fp16"), torch.nn.Conv2d(1, 1, 1), "cpu", training=False) as t:
        assert t.scaler is None
