"""TF32 flags: after the advisor writes them, every reader works (legacy getters included: Inductor,
Dynamo and Lightning call them), and the user's flags come back exactly (gpu_audit #2, #14)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from advisor.apply import apply_settings
from advisor.device import flags
from advisor.knobs import GlobalFlags, Settings

WANT = {"off": (False, False), "conv": (True, False), "on": (True, True)}


def _legacy() -> tuple[str, bool, bool]:
    """The legacy getters: each raises when the two APIs were mixed."""
    return (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


@pytest.fixture(autouse=True)
def _flags_restored() -> Iterator[None]:
    saved = flags.read_raw()
    yield
    flags.restore_raw(saved)
    assert flags.read_raw() == saved


@pytest.mark.parametrize("tf32", ["off", "conv", "on"])
@pytest.mark.parametrize("user", [None, "high", "medium", "highest"])
def test_every_reader_works_after_the_flags_are_written(tf32: str, user: str | None) -> None:
    if user is not None:
        torch.set_float32_matmul_precision(user)
    before = flags.read_raw()
    conv, matmul = WANT[tf32]
    with GlobalFlags() as gf:
        gf.apply(Settings(tf32=tf32))
        precision, cublas, cudnn = _legacy()  # no "mix of the legacy and new APIs"
        assert cudnn is conv and cublas is matmul
        assert (precision != "highest") is matmul
        assert GlobalFlags.matmul_tf32() is matmul and flags.conv_tf32() is conv
        if matmul and user == "medium":
            assert precision == "medium"  # the user's CPU bf16 matmuls are kept
    assert flags.read_raw() == before


def test_a_users_new_api_values_come_back_exactly() -> None:
    # The user wrote the new API only: the legacy getters raise for them already, and the
    # legacy value they hide cannot be read. Every new-API value comes back exactly; the
    # hidden legacy value is left consistent with them, so the getters read again.
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    before = flags.read_raw()
    assert before["legacy_matmul"] is None and before["legacy_cudnn"] is None
    with GlobalFlags() as gf:
        gf.apply(Settings(tf32="off"))
        _legacy()  # consistent while the advisor's flags are in force
    after = flags.read_raw()
    assert after["new"] == before["new"]
    assert after["legacy_matmul"] == "high"  # TF32 CUDA matmuls, as the user's value says


def test_candidates_never_write_the_new_api(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.7/2.8 accept only "default"/"tf32" for CUDA in the new API (writing "ieee"
    # raised); the legacy setters exist everywhere and keep both views in step.
    written: list[tuple[str, ...]] = []
    real = torch._C._set_fp32_precision_setter

    def spy(*args: str) -> None:
        written.append(args)
        real(*args)

    monkeypatch.setattr(torch._C, "_set_fp32_precision_setter", spy)
    for tf32 in ("off", "conv", "on"):
        GlobalFlags.switch_to(Settings(tf32=tf32))
    assert written == []


@pytest.mark.usefixtures("cuda_standin")
@pytest.mark.parametrize("tf32", ["off", "on"])
def test_apply_on_cuda_leaves_the_legacy_getters_readable(tf32: str) -> None:
    # The audit's reproduction, on the CUDA path (through the stand-in): apply_settings with
    # tf32 "on" left torch.get_float32_matmul_precision() raising; "off", cudnn.allow_tf32.
    tuned = apply_settings(Settings(tf32=tf32), nn.Conv2d(3, 3, 3), "cuda")
    try:
        precision, cublas, cudnn = _legacy()
        assert (cudnn, cublas) == WANT[tf32]
    finally:
        tuned.restore()


def test_on_a_cpu_the_tf32_flags_are_left_as_the_user_set_them() -> None:
    torch.set_float32_matmul_precision("medium")  # e.g. bf16 oneDNN matmuls on this CPU

    def tf32_raw() -> dict:
        # oneDNN's conv precision is cpu_fp32's flag, written on a CPU with bf16 units only.
        raw = flags.read_raw()
        return {**raw, "new": {k: v for k, v in raw["new"].items() if k != "mkldnn.conv"}}

    before = tf32_raw()
    tuned = apply_settings(Settings(tf32="off"), nn.Conv2d(3, 3, 3), "cpu")
    try:
        assert tf32_raw() == before  # TF32 is CUDA only: nothing to write
    finally:
        tuned.restore()


@pytest.mark.slow
@pytest.mark.usefixtures("cuda_standin")
def test_torch_compile_after_apply_with_tf32_on() -> None:
    # What a user does next: torch.compile reads torch.get_float32_matmul_precision() when it
    # builds its cache key (an InductorError "mix of the legacy and new APIs" before).
    torch._dynamo.reset()
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    tuned = apply_settings(Settings(tf32="on"), model, "cuda")
    try:
        compiled = torch.compile(tuned.model)
        x = torch.randn(1, 3, 8, 8)
        torch.testing.assert_close(compiled(x), model(x))
    finally:
        tuned.restore()
        torch._dynamo.reset()
