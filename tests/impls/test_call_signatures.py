"""A swapped layer computes every call its PyTorch module computes, or hands it to PyTorch.

Every call signature of nn.Conv*/nn.ConvTranspose* forward (zero batch, no batch dim,
output_size= in its accepted forms, strided and channels-last inputs, padding modes and strings,
dtypes) through every implementation that accepts the layer: no raise, the numbers of PyTorch's
module (forward and every gradient), and a fallback exactly where the implementation says
"not this call".
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from advisor import impls
from advisor.errors import ImplError
from advisor.impls import _swap
from tests.impls.conv_cases import to_channels_last
from tests.impls.swap_check import compare

pytestmark = pytest.mark.usefixtures("one_thread")

SWAPPED = [n for n in impls.names() if n != "native"]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton on CPU tensors


@dataclass
class Call:
    module: Callable[[], nn.Module]
    shape: tuple[int, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    layout: Callable[[Tensor], Tensor] = lambda x: x  # noqa: E731
    dtype: torch.dtype = torch.float32
    falls_back: tuple[str, ...] = ()  # the implementations that leave this call to PyTorch

    def input(self) -> Tensor:
        gen = torch.Generator().manual_seed(0)
        wide = torch.complex128 if self.dtype.is_complex else torch.float64
        x = torch.randn(self.shape, generator=gen, dtype=wide).to(self.dtype)
        return self.layout(x).requires_grad_()


def _strided(x: Tensor) -> Tensor:
    """The same values, every other element of a twice-as-wide buffer: no dim is contiguous."""
    return torch.stack([x, torch.full_like(x, float("nan"))], -1)[..., 0]


def _swapped_hw(x: Tensor) -> Tensor:
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _cl(x: Tensor) -> Tensor:
    return to_channels_last(x)


T2 = lambda: nn.ConvTranspose2d(4, 2, 2, stride=2)  # noqa: E731  (transpose_as_mul's kind)
EVERY_IMPL = tuple(SWAPPED)
CALLS: dict[str, Call] = {
    # zero batch: computed, right shape and (zero) gradients
    "zero_batch_conv1d": Call(lambda: nn.Conv1d(3, 4, 3, padding=1), (0, 3, 7)),
    "zero_batch_conv2d": Call(lambda: nn.Conv2d(3, 4, (3, 2)), (0, 3, 7, 5)),
    "zero_batch_conv2d_cl": Call(lambda: nn.Conv2d(4, 6, 3, groups=2), (0, 4, 5, 5), layout=_cl),
    "zero_batch_pointwise": Call(lambda: nn.Conv2d(4, 6, 1, groups=2), (0, 4, 5, 5)),
    "zero_batch_conv3d": Call(
        lambda: nn.Conv3d(2, 4, (1, 3, 3), padding=(0, 1, 1)), (0, 2, 3, 5, 5)
    ),
    "zero_batch_t1d": Call(lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), (0, 3, 5)),
    "zero_batch_t2d": Call(T2, (0, 4, 3, 3)),
    "zero_batch_t3d": Call(lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), (0, 2, 2, 3, 2)),
    "zero_batch_reflect": Call(
        lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (0, 3, 5, 5)
    ),
    # no batch dim
    "unbatched_conv1d": Call(lambda: nn.Conv1d(3, 4, 3, stride=2), (3, 9)),
    "unbatched_conv2d": Call(lambda: nn.Conv2d(3, 4, 3, padding="same"), (3, 6, 5)),
    "unbatched_conv3d": Call(lambda: nn.Conv3d(2, 4, (1, 3, 3)), (2, 3, 5, 5)),
    "unbatched_t2d": Call(T2, (4, 3, 3)),
    "unbatched_t1d_dilated": Call(lambda: nn.ConvTranspose1d(2, 3, 3, dilation=2), (2, 5)),
    # output_size=, in every form nn.ConvTranspose*d accepts
    "output_size_exact": Call(T2, (1, 4, 3, 3), {"output_size": [6, 6]}),
    "output_size_list": Call(
        T2, (1, 4, 3, 3), {"output_size": [7, 6]}, falls_back=("transpose_as_mul",)
    ),
    "output_size_torch_size": Call(
        T2, (2, 4, 3, 3), {"output_size": torch.Size([7, 7])}, falls_back=("transpose_as_mul",)
    ),
    "output_size_with_batch_channel": Call(
        T2, (2, 4, 3, 3), {"output_size": (2, 2, 7, 7)}, falls_back=("transpose_as_mul",)
    ),
    "output_size_unbatched": Call(
        T2, (4, 3, 3), {"output_size": [7, 7]}, falls_back=("transpose_as_mul",)
    ),
    "output_size_unbatched_channel": Call(
        T2, (4, 3, 3), {"output_size": [2, 6, 7]}, falls_back=("transpose_as_mul",)
    ),
    "output_size_t1d": Call(
        lambda: nn.ConvTranspose1d(2, 2, 3, stride=3),
        (1, 2, 4),
        {"output_size": [13]},
        falls_back=("transpose_as_mul",),
    ),
    "output_size_t3d": Call(
        lambda: nn.ConvTranspose3d(2, 2, 2, stride=2),
        (1, 2, 2, 2, 2),
        {"output_size": [5, 4, 5]},
        falls_back=("transpose_as_mul",),
    ),
    "output_size_overlapping": Call(
        lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1),
        (1, 3, 4, 4),
        {"output_size": [8, 7]},
    ),
    "output_size_zero_batch": Call(
        T2, (0, 4, 3, 3), {"output_size": [7, 7]}, falls_back=("transpose_as_mul",)
    ),
    # layouts
    "strided_conv2d": Call(lambda: nn.Conv2d(3, 4, 3, stride=2), (2, 3, 7, 6), layout=_strided),
    "strided_t2d": Call(T2, (2, 4, 3, 3), layout=_strided),
    "transposed_hw_conv2d": Call(lambda: nn.Conv2d(3, 4, 3), (2, 3, 6, 5), layout=_swapped_hw),
    "channels_last_conv2d": Call(
        lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 5, 5), layout=_cl
    ),
    "channels_last_conv3d": Call(lambda: nn.Conv3d(2, 4, (1, 3, 3)), (2, 2, 3, 4, 4), layout=_cl),
    "channels_last_conv1d": Call(lambda: nn.Conv1d(3, 4, 1), (2, 3, 6), layout=_cl),
    "channels_last_t2d": Call(T2, (2, 4, 3, 3), layout=_cl),
    "channels_last_t2d_overlap": Call(
        lambda: nn.ConvTranspose2d(3, 4, 3, stride=2), (2, 3, 3, 4), layout=_cl
    ),
    # padding modes and strings
    **{
        f"{mode}_{nd}d": Call(
            lambda mode=mode, nd=nd: getattr(nn, f"Conv{nd}d")(
                2, 3, 3, padding=1, padding_mode=mode
            ),
            (2, 2, *[5] * nd),
        )
        for mode in ("zeros", "reflect", "replicate", "circular")
        for nd in (1, 2, 3)
    },
    "same_even_kernel_reflect": Call(
        lambda: nn.Conv2d(2, 3, (2, 4), padding="same", padding_mode="reflect"), (1, 2, 5, 6)
    ),
    "same_dilated": Call(lambda: nn.Conv1d(2, 3, 4, padding="same", dilation=2), (2, 2, 9)),
    "same_conv3d_time1": Call(lambda: nn.Conv3d(2, 3, (1, 2, 3), padding="same"), (1, 2, 3, 4, 5)),
    "valid": Call(lambda: nn.Conv2d(2, 3, 3, padding="valid"), (1, 2, 5, 4)),
    "circular_conv3d_time1": Call(
        lambda: nn.Conv3d(2, 3, (1, 3, 3), padding=(0, 1, 1), padding_mode="circular"),
        (1, 2, 2, 4, 4),
    ),
    # dtypes
    "float64": Call(
        lambda: nn.Conv2d(3, 4, 3).double(),
        (2, 3, 5, 5),
        dtype=torch.float64,
        falls_back=("triton",),
    ),
    "float64_t2d": Call(
        lambda: T2().double(), (2, 4, 3, 3), dtype=torch.float64, falls_back=("triton",)
    ),
    "bfloat16": Call(lambda: nn.Conv2d(3, 4, 3).bfloat16(), (2, 3, 5, 5), dtype=torch.bfloat16),
    "float16_t2d": Call(lambda: T2().half(), (2, 4, 3, 3), dtype=torch.float16),
    "complex64": Call(
        lambda: nn.Conv2d(3, 4, 3, dtype=torch.complex64),
        (2, 3, 5, 5),
        dtype=torch.complex64,
        falls_back=EVERY_IMPL,
    ),
    "complex64_t2d": Call(
        lambda: nn.ConvTranspose2d(4, 2, 2, stride=2, dtype=torch.complex64),
        (1, 4, 3, 3),
        dtype=torch.complex64,
        falls_back=EVERY_IMPL,
    ),
    # Lazy modules: initialised by the call, and still swapped afterwards
    "lazy_conv2d": Call(lambda: nn.LazyConv2d(4, 3, padding=1), (2, 3, 5, 5)),
    "lazy_conv3d": Call(lambda: nn.LazyConv3d(4, (1, 3, 3)), (2, 3, 2, 5, 5)),
    "lazy_t2d": Call(
        lambda: nn.LazyConvTranspose2d(2, 2, stride=2),
        (1, 4, 3, 3),
        {"output_size": [7, 7]},
        falls_back=("transpose_as_mul",),
    ),
}
PAIRS = [(name, impl) for name in CALLS for impl in SWAPPED]


def _swappable(module: nn.Module, impl: str) -> bool:
    try:
        impls.swap(copy.deepcopy(module), impl)
    except ImplError:
        return False
    return True


# a call through triton runs in its interpreter on a CPU (0.1-4 s each): in the slow run;
# test_triton runs the kernels by default
@pytest.mark.parametrize(
    ("name", "impl"),
    [pytest.param(n, i, marks=pytest.mark.slow) if i == "triton" else (n, i) for n, i in PAIRS],
    ids=[f"{n}-{i}" for n, i in PAIRS],
)  # fmt: skip
def test_call_computes_or_falls_back(name: str, impl: str) -> None:
    if impl == "triton":
        pytest.importorskip("triton")
    call = CALLS[name]
    module = call.module()
    if not _swappable(module, impl):
        pytest.skip(f"{impl} does not take this layer")
    outcome = compare(module, impl, call.input(), call.kwargs)
    assert outcome.pytorch_raised is None, outcome.pytorch_raised  # the call is a valid one
    tol = TOL.get(call.dtype, 1e-5)
    assert outcome.worst < tol, outcome.errors
    assert outcome.fallbacks == (impl in call.falls_back), outcome


def test_every_impl_takes_some_calls() -> None:
    for impl in SWAPPED:
        assert sum(_swappable(c.module(), impl) for c in CALLS.values()) >= 4, impl


def test_fallback_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    module = impls.swap(T2(), "transpose_as_mul")
    x = torch.randn(1, 4, 3, 3)
    module(x)
    assert _swap.fallbacks(module) == 0
    with caplog.at_level(logging.DEBUG, logger="advisor.impls._swap"):
        out = module(x, output_size=[7, 7])
        module(x, output_size=[7, 6])
    assert out.shape == (1, 2, 7, 7)
    assert module.fallbacks == 2 and _swap.fallbacks(module) == 2
    first = caplog.records[0]
    assert first.name == _swap.__name__ and first.levelno == logging.DEBUG
    message = first.getMessage()
    assert "ConvTranspose2d(4, 2, kernel_size=(2, 2), stride=(2, 2))" in message
    assert "transpose_as_mul" in message and "output_padding [1, 1]" in message
    # the count travels with copies, starts over on a new swap, and leaves with the swap
    assert _swap.fallbacks(copy.deepcopy(module)) == 2
    assert _swap.fallbacks(pickle.loads(pickle.dumps(module))) == 2
    impls.swap(module, "unfold_gemm")
    assert _swap.fallbacks(module) == 0
    module(x, output_size=[7, 7])
    assert _swap.fallbacks(module) == 0  # unfold_gemm computes it
    impls.swap(module, "native")
    assert "fallbacks" not in vars(module) and _swap.fallbacks(module) == 0


def test_a_bug_in_an_implementation_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only call_why_not decides a fallback: an exception inside the implementation propagates."""

    def broken(*args: object) -> Tensor:
        raise RuntimeError("a bug")

    monkeypatch.setitem(_swap._FORWARDS, "unfold_gemm", broken)
    module = impls.swap(nn.Conv2d(3, 4, 3), "unfold_gemm")
    with pytest.raises(RuntimeError, match="a bug"):
        module(torch.randn(1, 3, 5, 5))
    assert _swap.fallbacks(module) == 0


def test_pytorch_errors_stay_pytorch_errors() -> None:
    """Where PyTorch's module raises, the swapped one raises the same kind of error."""
    t2 = impls.swap(T2(), "transpose_as_mul")
    with pytest.raises(ValueError, match="requested an output size"):
        t2(torch.randn(1, 4, 3, 3), output_size=[9, 9])  # beyond what output_padding reaches
    conv = impls.swap(nn.Conv2d(3, 4, 3), "unfold_gemm")
    with pytest.raises(RuntimeError):
        conv(torch.randn(1, 3, 0, 5))  # an empty spatial dim: PyTorch's own error
    assert _swap.fallbacks(conv) == 1


def test_lazy_module_stays_swapped_after_initialising() -> None:
    module = impls.swap(nn.LazyConv2d(4, 3), "unfold_gemm")
    module(torch.randn(1, 3, 5, 5))
    assert type(module).__name__ == "UnfoldGemmConv2d" and isinstance(module, nn.Conv2d)
    assert module.in_channels == 3
    impls.swap(module, "native")
    assert type(module) is nn.Conv2d


def test_autocast_leaves_float64_alone_as_pytorch_does() -> None:
    """Under autocast a float64 conv stays float64 in PyTorch: so in the swapped one too."""
    x = torch.randn(1, 4, 3, 3, dtype=torch.float64)
    for impl in ("transpose_as_mul", "triton"):
        module = T2().double()
        want = module(x)
        impls.swap(module, impl)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = module(x)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)
        assert _swap.fallbacks(module) == (impl == "triton")
