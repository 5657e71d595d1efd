"""Triton kernels under TRITON_INTERPRET=1 on CPU: forward, grad input and grad weight.

The kernels are decorated on first use under the current TRITON_INTERPRET value (see
advisor.impls.triton_conv), so a fixture setting the variable is enough: no import-order tricks,
and other test modules keep their environment. Every output buffer is pre-filled with NaN
(POISON_OUTPUTS), so an element a kernel forgets to write fails the finiteness check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

triton = pytest.importorskip("triton")

from advisor.impls import triton_conv as tc  # noqa: E402
from advisor.impls import triton_loader, why_not  # noqa: E402
from advisor.impls.base import ConvSignature  # noqa: E402
from advisor.knobs import GlobalFlags, Settings  # noqa: E402
from tests.impls.conv_cases import Case, cases, check  # noqa: E402

# The interpreter is slow: few, tiny examples; fixed cases below cover the rest.
INTERP = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SMALL = {"max_channels": 2, "max_size": 5}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tc, "POISON_OUTPUTS", True)


@INTERP
@given(cases(ndims=(1, 2), **SMALL))
def test_conv_fp32(case: Case) -> None:
    check(tc.triton_conv, case)


@pytest.mark.slow  # triton's interpreter on a CPU (2.2 s); test_conv_fp32 runs by default
@INTERP
@given(cases(ndims=(1, 2), transposed=True, **SMALL))
def test_conv_transpose_fp32(case: Case) -> None:
    check(tc.triton_conv_transpose, case)


BASE = Case(
    transposed=False,
    n=2,
    cin=4,
    cout=6,
    size=(5, 6),
    kernel=(3, 3),
    stride=(1, 1),
    padding=(1, 1),
    dilation=(1, 1),
    groups=1,
    bias=True,
    channels_last=False,
)
FIXED = {
    "plain": BASE,
    "channels_last_strided": dataclasses.replace(BASE, channels_last=True, stride=(2, 1)),
    "dilated_same": dataclasses.replace(BASE, padding="same", dilation=(2, 1), kernel=(2, 3)),
    "grouped": dataclasses.replace(BASE, groups=2, bias=False),
    "depthwise": dataclasses.replace(BASE, cin=4, cout=8, groups=4),
    "conv1d": dataclasses.replace(
        BASE, size=(9,), kernel=(3,), stride=(2,), padding=(1,), dilation=(1,)
    ),
    "conv3d_cl": dataclasses.replace(
        BASE,
        cin=3,
        cout=4,
        size=(3, 4, 5),
        kernel=(1, 3, 3),
        stride=(1, 1, 2),
        padding=(0, 1, 1),
        dilation=(1, 1, 1),
        channels_last=True,
    ),
}


@pytest.mark.parametrize("name", list(FIXED))
# triton's interpreter on a CPU (0.1-1 s a case): the half dtypes in the slow run
@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow),
     pytest.param(torch.float16, marks=pytest.mark.slow)],
)  # fmt: skip
def test_conv_fixed(name: str, dtype: torch.dtype) -> None:
    check(tc.triton_conv, FIXED[name], dtype)


TFIXED = {
    "t2d_overlap": dataclasses.replace(
        BASE, transposed=True, stride=(2, 2), output_padding=(1, 0), size=(3, 4)
    ),
    "t2d_depthwise_2x2": dataclasses.replace(
        BASE,
        transposed=True,
        cin=4,
        cout=4,
        groups=4,
        kernel=(2, 2),
        stride=(2, 2),
        padding=(0, 0),
        output_padding=(0, 0),
        channels_last=True,
    ),
    "t3d": dataclasses.replace(
        BASE,
        transposed=True,
        cin=2,
        cout=3,
        size=(2, 3, 3),
        kernel=(2, 2, 2),
        stride=(2, 1, 2),
        padding=(0, 1, 0),
        dilation=(1, 1, 1),
        output_padding=(1, 0, 0),
    ),
}


@pytest.mark.parametrize("name", list(TFIXED))
@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)]
)
def test_conv_transpose_fixed(name: str, dtype: torch.dtype) -> None:
    check(tc.triton_conv_transpose, TFIXED[name], dtype)


def test_split_reduction_for_grad_weight_covers_all_positions() -> None:
    # p = 2*8*8 >= 64, so the interpreter splits the grad-weight reduction in two.
    check(tc.triton_conv, dataclasses.replace(BASE, size=(8, 8)))


def test_output_keeps_channels_last() -> None:
    x = torch.randn(1, 4, 5, 5).to(memory_format=torch.channels_last)
    out = tc.triton_conv(x, torch.randn(4, 4, 3, 3), None, 1, 1)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_why_not() -> None:
    impl = tc.TritonImpl()
    sig = ConvSignature.from_module(torch.nn.Conv2d(3, 4, 3))
    cpu = torch.device("cpu")
    assert impl.why_not(sig, device=cpu, dtype=torch.float32) is None
    assert "float64" in impl.why_not(sig, device=cpu, dtype=torch.float64)  # type: ignore[operator]


def test_why_not_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    sig = ConvSignature.from_module(torch.nn.Conv2d(3, 4, 3))
    reason = tc.TritonImpl().why_not(sig, device=torch.device("cpu"), dtype=torch.float32)
    assert reason is not None and "TRITON_INTERPRET" in reason


def test_why_not_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_loader, "triton_import_problem", lambda: "triton is not installed")
    sig = ConvSignature.from_module(torch.nn.Conv2d(3, 4, 3))
    reason = tc.TritonImpl().why_not(sig, device=torch.device("cpu"), dtype=torch.float32)
    assert reason == "triton is not installed"


@pytest.fixture
def _matmul_precision_restored() -> Iterator[None]:
    """Leave PyTorch's global matmul precision as found: a test below sets it, as a user would."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.usefixtures("_matmul_precision_restored")
def test_user_matmul_precision_then_global_flags_do_not_mix_apis() -> None:
    # A user's script sets "high"; the search then applies candidates through GlobalFlags (new
    # API). Reading a legacy flag after that raises (torch 2.13): the Triton path asks
    # GlobalFlags instead, and follows the conv flag in force (a Triton conv replaces a cuDNN
    # conv): TF32 under tf32="conv" (PyTorch's default) and "on", IEEE only under "off".
    torch.set_float32_matmul_precision("high")
    assert tc._precision(torch.float32) == "tf32"  # PyTorch's default: cuDNN convs in TF32
    check(tc.triton_conv, BASE)
    with GlobalFlags() as flags:
        for tf32, want in (("conv", "tf32"), ("on", "tf32"), ("off", "ieee")):
            flags.apply(Settings(tf32=tf32))
            assert tc._precision(torch.float32) == want, tf32
            assert tc._precision(torch.bfloat16) == "ieee"
            check(tc.triton_conv, BASE)
    assert tc._precision(torch.float32) == "tf32"  # GlobalFlags restored the user's flags


def test_the_launch_gets_the_conv_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    """One tiny interpreted launch per tf32 value: the forward kernel receives the precision the
    settings give convs. (The interpreter computes tl.dot in IEEE whatever it is told, so the
    numbers are checked, the TF32 rounding itself only on a GPU.)"""
    kernel = triton_loader.kernels().conv_fwd_kernel
    seen: list[str] = []
    launch = kernel.run

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(str(kwargs["PRECISION"]))
        return launch(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", recording)
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)
    with GlobalFlags() as flags:
        for tf32 in ("off", "conv", "on"):
            flags.apply(Settings(tf32=tf32))
            y = tc.triton_conv(x, w, None, 1, 1)
            torch.testing.assert_close(y, torch.nn.functional.conv2d(x, w, None, 1, 1))
            tc.triton_conv(x.bfloat16(), w.bfloat16(), None, 1, 1)
    assert seen == ["ieee", "ieee", "tf32", "ieee", "tf32", "ieee"]


@pytest.fixture
def _fresh_kernels_problem() -> Iterator[None]:
    """kernels_problem caches per TRITON_INTERPRET value: start and end each test uncached."""
    triton_loader.kernels_problem.cache_clear()
    yield
    triton_loader.kernels_problem.cache_clear()


SIG = ConvSignature.from_module(torch.nn.Conv2d(3, 4, 3))
CPU = torch.device("cpu")


@pytest.mark.usefixtures("_fresh_kernels_problem")
def test_why_not_when_the_kernels_do_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise AttributeError("module 'triton' has no attribute 'knobs'\nsecond line")

    monkeypatch.setattr(triton_loader, "kernels", broken)
    for _ in range(2):
        reason = tc.TritonImpl().why_not(SIG, device=CPU, dtype=torch.float32)
        assert reason is not None and "\n" not in reason
        assert reason.startswith(f"triton {triton.__version__} cannot load the kernels here: ")
        assert "AttributeError: module 'triton' has no attribute 'knobs'" in reason
    assert len(calls) == 1  # cached per TRITON_INTERPRET value


@pytest.mark.usefixtures("_fresh_kernels_problem")
def test_why_not_with_an_old_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton, "__version__", "3.3.1")
    reason = tc.TritonImpl().why_not(SIG, device=CPU, dtype=torch.float32)
    assert reason == "triton 3.3.1 is too old: the kernels need triton>=3.4"


@pytest.mark.usefixtures("_fresh_kernels_problem")
def test_why_not_loads_the_kernels_through_the_registry() -> None:
    assert why_not("triton", torch.nn.Conv2d(3, 4, 3), device=CPU, dtype=torch.float32) is None
    assert triton_loader.kernels_problem(True) is None  # loaded under the interpreter, and cached
    assert triton_loader.kernels().INTERPRET


# ---- first-call cost: which configs are autotuned, what recompiles, which layers are skipped ----


def _compiled(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The kernel module as a GPU run decorates it (full config lists): decorating needs no GPU."""
    monkeypatch.delenv("TRITON_INTERPRET")
    return triton_loader.kernels()


def _tiles(autotuner: Any, **named: int) -> list[tuple[int, int, int]]:
    """The configs Triton's own Autotuner.prune_configs keeps for a launch with these args."""
    autotuner.nargs = named
    try:
        kept = autotuner.prune_configs({})
    finally:
        autotuner.nargs = None
    return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in kept]


def test_autotune_configs_are_pruned_to_the_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    k = _compiled(monkeypatch)
    fwd, dgrad, wgrad = k.conv_fwd_kernel, k.conv_dgrad_kernel, k.conv_wgrad_kernel
    assert (len(fwd.configs), len(wgrad.configs)) == (7, 5)
    # depthwise, 1 channel per group: the narrowest tiles only
    assert _tiles(fwd, M=3136, CGI=1, CGO=1) == [(128, 16, 16)]
    assert _tiles(dgrad, M=3136, CGI=1, CGO=1) == [(128, 16, 16)]
    assert _tiles(wgrad, P=3136, SPLIT=4, CGI=1, CGO=1) == [(16, 16, 128)]
    # an RGB stem 3 -> 16 (224x224, stride 2): one config each, nothing to benchmark
    assert _tiles(fwd, M=112 * 112, CGI=3, CGO=16) == [(128, 16, 16)]
    assert _tiles(dgrad, M=224 * 224, CGI=3, CGO=16) == [(128, 16, 16)]
    assert _tiles(wgrad, P=112 * 112, SPLIT=8, CGI=3, CGO=16) == [(16, 16, 128)]
    # 64 -> 128 on 28x28: the forward keeps all 7; no tile wider than 64 input channels
    assert len(_tiles(fwd, M=784, CGI=64, CGO=128)) == 7
    assert all(n <= 64 for _, n, _ in _tiles(dgrad, M=784, CGI=64, CGO=128))
    assert len(_tiles(dgrad, M=784, CGI=64, CGO=128)) == 5
    assert len(_tiles(wgrad, P=784, SPLIT=1, CGI=64, CGO=128)) == 4
    # grouped 64 -> 128 in 4 groups (16 -> 32 per group): only 16-deep reductions
    assert _tiles(fwd, M=784, CGI=16, CGO=32) == [(128, 16, 16), (64, 32, 16)]
    # a 7x7 map at batch 1 (M = 49): no 128-row tiles
    assert _tiles(fwd, M=49, CGI=512, CGO=512) == [(64, 128, 32), (64, 64, 32), (64, 32, 16)]
    for size in (1, 2, 15, 16, 17, 100, 4096):  # never empty
        assert _tiles(fwd, M=size, CGI=size, CGO=size) and _tiles(dgrad, M=1, CGI=size, CGO=1)
        assert _tiles(wgrad, P=size, SPLIT=2, CGI=size, CGO=size)


def test_sizes_of_outer_dims_do_not_recompile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two layers that differ in height, kernel height and pad bind to the same compiled kernel
    (Triton's own binder, specialisation included); one differing in width does not."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import KernelParam, create_function_from_signature

    launches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    interpreted = triton_loader.kernels().conv_fwd_kernel
    launch = interpreted.run

    def recording(*args: Any, **kwargs: Any) -> Any:
        launches.append((args, kwargs))
        return launch(*args, **kwargs)

    monkeypatch.setattr(interpreted, "run", recording)
    for h, kh, w in ((16, 3, 16), (17, 1, 16), (16, 3, 17)):
        x, weight = torch.randn(1, 4, h, w), torch.randn(8, 4, kh, 3)
        tc.triton_conv(x, weight, None, 1, (kh // 2, 1))
    jit_fn = _compiled(monkeypatch).conv_fwd_kernel.fn
    names = {p.name for p in jit_fn.params if p.do_not_specialize}
    assert names == {"D", "H", "OD", "OH", "KD", "KH", "PD", "PH"}
    blocks = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32}

    def specialisations(params: list[Any]) -> list[Any]:
        bind = create_function_from_signature(jit_fn.signature, params, BaseBackend)
        return [bind(*args, **kwargs, **blocks)[1] for args, kwargs in launches]

    taller, shorter, wider = specialisations(jit_fn.params)
    assert taller == shorter and taller != wider
    # the same with every int specialised (Triton's default): KH == 1 alone would recompile
    default = [KernelParam(p.num, p._param, False, False) for p in jit_fn.params]
    taller, shorter, _ = specialisations(default)
    assert taller != shorter


@pytest.mark.parametrize(
    ("module", "thin"),
    [
        (torch.nn.Conv2d(32, 32, 3, groups=32), True),  # depthwise
        (torch.nn.Conv2d(64, 64, 3, groups=8), True),  # 8 per group
        (torch.nn.ConvTranspose2d(2048, 2048, 2, stride=2, groups=2048), True),
        (torch.nn.Conv2d(64, 64, 3, groups=4), False),  # 16 per group
        (torch.nn.Conv2d(3, 16, 3), False),  # an RGB stem: 16 outputs
        (torch.nn.Conv2d(16, 3, 3), False),
        (torch.nn.Conv2d(3, 4, 3), False),  # thin but ungrouped: one config, one compile
    ],
)
def test_depthwise_like_groups_are_left_to_native(module: torch.nn.Module, thin: bool) -> None:
    reason = why_not("triton", module, device=CPU, dtype=torch.float32)
    if thin:
        assert reason is not None and "channels per group (depthwise-like)" in reason
        assert "native" in reason
    else:
        assert reason is None
