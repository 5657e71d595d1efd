"""wrap/swap: same parameters and state_dict keys, same numbers, unwrap, copy, pickle, reasons."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from advisor import impls
from advisor.errors import ImplError
from advisor.impls._swap import original_class
from advisor.impls.base import ConvSignature
from tests._cli import python_code

CPU = torch.device("cpu")

# (impl, factory of a layer it runs, input shape)
LAYERS = [
    ("unfold_gemm", lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9, 9)),
    ("unfold_gemm", lambda: nn.Conv1d(3, 5, 3, padding="same", padding_mode="reflect"), (2, 3, 8)),
    ("unfold_gemm", lambda: nn.Conv3d(2, 4, (1, 3, 3), padding=(0, 1, 1)), (1, 2, 3, 6, 6)),
    ("unfold_gemm", lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1), (2, 4, 5, 5)),
    ("triton", lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), (1, 3, 5, 5)),
    ("triton", lambda: nn.ConvTranspose1d(4, 2, 3, stride=2), (1, 4, 5)),
    ("fold_time", lambda: nn.Conv3d(2, 4, (1, 3, 3), padding=(0, 1, 1)), (2, 2, 4, 6, 6)),
    ("transpose_as_mul", lambda: nn.ConvTranspose2d(8, 8, 2, stride=2, groups=8), (2, 8, 4, 4)),
    ("transpose_as_mul", lambda: nn.ConvTranspose3d(4, 6, 2, stride=2, groups=2), (1, 4, 2, 3, 3)),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(LAYERS)]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton on CPU tensors


def _run(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    module.zero_grad()
    out = module(x)
    out.backward(torch.ones_like(out))  # deterministic upstream grad, same for both runs
    return (out.detach(), *(p.grad.clone() for p in module.parameters()))  # type: ignore[union-attr]


@pytest.mark.parametrize(("impl", "factory", "shape"), LAYERS, ids=IDS)
def test_wrap_keeps_parameters_keys_and_numbers(impl: str, factory, shape) -> None:  # noqa: ANN001
    if impl == "triton":
        pytest.importorskip("triton")
    torch.manual_seed(0)
    module = factory()
    original = type(module)
    x = torch.randn(shape)
    assert impls.why_not(impl, module, device=CPU, dtype=torch.float32) is None
    params = list(module.parameters())
    keys = list(module.state_dict())
    expected = _run(module, x)

    wrapped = impls.swap(module, impl)
    assert wrapped is module and isinstance(wrapped, original)
    assert type(wrapped)._advisor_impl == impl  # type: ignore[attr-defined]
    assert all(a is b for a, b in zip(wrapped.parameters(), params))
    assert list(wrapped.state_dict()) == keys
    for got, want in zip(_run(wrapped, x), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    # deepcopy and pickle (torch.save of a whole model) keep the swapped class
    for clone in (copy.deepcopy(wrapped), pickle.loads(pickle.dumps(wrapped))):
        assert type(clone) is type(wrapped)
        torch.testing.assert_close(clone(x), expected[0], rtol=1e-4, atol=1e-5)

    impls.swap(wrapped, "native")
    assert type(wrapped) is original


def test_checkpoints_load_both_ways() -> None:
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.ConvTranspose2d(4, 4, 2, stride=2))
    swapped = copy.deepcopy(plain)
    impls.swap(swapped[0], "unfold_gemm")
    impls.swap(swapped[2], "transpose_as_mul")
    for src, dst in ((plain, swapped), (swapped, plain)):
        buf = io.BytesIO()
        torch.save(src.state_dict(), buf)
        buf.seek(0)
        for p in dst.parameters():
            nn.init.zeros_(p)
        dst.load_state_dict(torch.load(buf))
        x = torch.randn(1, 3, 6, 6)
        torch.testing.assert_close(dst(x), src(x), rtol=1e-4, atol=1e-5)


def test_whole_model_save_and_load() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    impls.swap(model[0], "unfold_gemm")
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded[0]).__name__ == "UnfoldGemmConv2d"


def test_rewrapping_unwraps_first() -> None:
    module = nn.Conv2d(3, 4, 3)
    impls.swap(module, "unfold_gemm")
    impls.swap(module, "triton")
    assert original_class(module) is nn.Conv2d
    assert type(module).__mro__[1] is nn.Conv2d  # not a subclass of the unfold_gemm class


def test_optimizer_updates_the_wrapped_parameters() -> None:
    module = nn.Conv2d(3, 4, 3)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    impls.swap(module, "unfold_gemm")
    before = module.weight.detach().clone()
    module(torch.randn(1, 3, 5, 5)).sum().backward()
    opt.step()
    assert not torch.equal(before, module.weight)


REASONS = [
    ("fold_time", nn.Conv3d(2, 2, 3), "temporal kernel"),
    ("fold_time", nn.Conv3d(2, 2, (1, 3, 3), stride=(2, 1, 1)), "temporal stride"),
    ("fold_time", nn.Conv3d(2, 2, (1, 3, 3), padding=1), "temporal padding"),
    ("fold_time", nn.Conv2d(2, 2, 3), "only Conv3d"),
    ("transpose_as_mul", nn.ConvTranspose2d(2, 2, 3, stride=2), "overlap"),
    ("transpose_as_mul", nn.ConvTranspose2d(2, 2, 2, stride=2, padding=1), "padding"),
    ("transpose_as_mul", nn.ConvTranspose2d(2, 2, 2, stride=2, dilation=2), "dilation"),
    ("transpose_as_mul", nn.Conv2d(2, 2, 2, stride=2), "only transposed"),
    ("unfold_gemm", nn.ConvTranspose3d(2, 2, 3), "3-D"),
    ("unfold_gemm", nn.ConvTranspose2d(2, 2, 3, stride=1, dilation=2, output_padding=1), "output"),
]


@pytest.mark.parametrize(("impl", "module", "words"), REASONS)
def test_why_not_reasons_and_wrap_refuses(impl: str, module: nn.Module, words: str) -> None:
    reason = impls.why_not(impl, module, device=CPU, dtype=torch.float32)
    assert reason is not None and words in reason
    with pytest.raises(ImplError, match=words):
        impls.swap(module, impl)


def test_non_float_dtype_is_refused() -> None:
    sig = ConvSignature.from_module(nn.Conv2d(2, 2, 3))
    for name in ("unfold_gemm", "fold_time", "transpose_as_mul"):
        assert impls.get_impl(name).why_not(sig, device=CPU, dtype=torch.int32) is not None


def test_registration_order() -> None:
    names = impls.names()
    assert names[:5] == ["native", "unfold_gemm", "triton", "fold_time", "transpose_as_mul"]


def test_importing_impls_does_not_import_triton() -> None:
    code = "import sys, advisor.impls; assert 'triton' not in sys.modules"
    r = python_code(code)
    assert r.returncode == 0, r.stderr[-2000:]
