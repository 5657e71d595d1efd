"""Conv subclasses as libraries ship them (impls.classes): a class whose forward computes more than
a conv is either reproduced by a recipe (timm's StdConv2d, ScaledStdConv2d, Conv2dSame and their
'SAME' variants: checked here against timm's own forward in float64, forward and backward) or
never given an implementation's forward (QAT's ConvBn2d and ConvReLU2d, a user's subclass).
Lazy convs compute PyTorch's conv and are swapped like nn.Conv*.

timm is imported without its package's torchvision import where that fails
(tests/data/timm_convs.py); these tests are skipped, with the reason, wherever timm cannot be
imported (not installed, or failing to load in any way: tests/impls/test_timm_skip.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.ao.nn.intrinsic.qat as nniqat
from torch import Tensor, nn
from torch.ao.quantization import get_default_qat_qconfig
from torch.nn.utils import parametrizations

from advisor import impls
from advisor.apply import AdvisorWarning, apply_settings
from advisor.errors import ImplError
from advisor.impls import classes
from advisor.impls._swap import original_class
from advisor.impls.base import ConvSignature
from advisor.knobs import Settings
from advisor.workload.copying import copy_module
from advisor.workload.layer_spec import spec_from_module
from tests.impls.swap_check import compare

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def timm() -> dict[str, type[nn.Module]]:
    from tests.data.timm_convs import timm_layers

    try:
        return timm_layers()
    except ImportError as e:  # whatever failed: timm_layers says it as an ImportError
        pytest.skip(f"timm: {e}")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# (timm class, constructor arguments): 'SAME' with stride 2 is padded at run time, unevenly on
# the odd input below
TIMM = [
    ("StdConv2d", dict(in_channel=3, out_channels=6, kernel_size=3, padding=1)),
    ("StdConv2dSame", dict(in_channel=3, out_channels=6, kernel_size=3, stride=2)),
    ("ScaledStdConv2d", dict(in_channels=3, out_channels=6, kernel_size=3, stride=2, gain_init=0.7)),
    ("ScaledStdConv2dSame", dict(in_channels=3, out_channels=6, kernel_size=4, stride=2)),
    ("Conv2dSame", dict(in_channels=3, out_channels=6, kernel_size=3, stride=2, dilation=2)),
]


@pytest.mark.parametrize("impl", ["unfold_gemm", "triton"])
@pytest.mark.parametrize(("name", "kwargs"), TIMM, ids=[n for n, _ in TIMM])
def test_timm_convs_are_computed_as_timm_computes_them(timm, name: str, kwargs, impl: str) -> None:  # noqa: ANN001
    if impl == "triton":
        pytest.importorskip("triton")
    dtype, tol = (torch.float32, 1e-5) if impl == "triton" else (torch.float64, 1e-10)
    torch.manual_seed(0)
    module = timm[name](**kwargs).to(dtype)
    with torch.no_grad():  # a gain and a bias away from their initial values
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert impls.class_reason(module) is None
    assert impls.why_not(impl, module, device=CPU, dtype=dtype) is None
    x = torch.randn(2, 3, 9, 10, dtype=dtype, requires_grad=True)
    out = compare(module, impl, x)  # against timm's own forward, on a float64 copy
    assert {"output", "input grad", "weight grad"} <= set(out.errors)
    assert out.fallbacks == 0 and out.worst < tol, out.errors


def test_a_weight_normed_timm_conv_is_both(timm) -> None:  # noqa: ANN001
    module = parametrizations.weight_norm(timm["StdConv2d"](3, 6, 3, padding=1)).double()
    assert classes.recipe_for(type(module)) is not None  # the class parametrize derived from it
    out = compare(module, "unfold_gemm", torch.randn(2, 3, 7, 7, dtype=torch.float64))
    assert out.worst < 1e-10, out.errors


def test_conv_input_shape_is_what_the_padded_conv_receives(timm) -> None:  # noqa: ANN001
    same = timm["Conv2dSame"](3, 6, 3, stride=2)
    assert classes.conv_input_shape(same, (2, 3, 9, 10)) == (2, 3, 11, 11)
    assert classes.conv_input_shape(nn.Conv2d(3, 6, 3), (2, 3, 9, 10)) == (2, 3, 9, 10)


class _Standardised(nn.Conv2d):
    """A class whose forward standardises its weight, as StdConv2d does."""

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / w.std((1, 2, 3), keepdim=True)
        return self._conv_forward(x, w, self.bias)


def test_a_recipe_that_does_not_hold_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe is checked against the class's own forward before any use: one that differs
    (another library version, say) leaves the layer to PyTorch's forward, saying so."""
    monkeypatch.setattr(classes, "_CHECKED", {})
    path = classes.class_name(_Standardised)
    monkeypatch.setitem(classes._RECIPES, path, classes.Recipe("nothing"))
    module = _Standardised(3, 4, 3)
    reason = impls.class_reason(module)
    assert reason is not None and "differs from its forward" in reason
    with pytest.raises(ImplError, match="differs"):
        impls.swap(module, "unfold_gemm")
    monkeypatch.setattr(classes, "_CHECKED", {})
    monkeypatch.setitem(classes._RECIPES, path, classes.Recipe("std", weight=_unbiased_std))
    assert impls.class_reason(module) is None
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    assert compare(module.double(), "unfold_gemm", x).worst < 1e-10


def _unbiased_std(m: nn.Module) -> Tensor:
    w: Tensor = m.weight  # type: ignore[assignment]
    return (w - w.mean((1, 2, 3), keepdim=True)) / w.std((1, 2, 3), keepdim=True)


class UserConv(nn.Conv2d):
    """A user's own conv: its forward scales the output."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * 0.5


class UserConvForward(nn.Conv2d):
    """A user's own conv that overrides _conv_forward only (nn.Conv2d.forward calls it)."""

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return super()._conv_forward(x, weight.flip(-1), bias)


def _qat(cls: type[nn.Module], cin: int = 3) -> Callable[[], nn.Module]:
    return lambda: cls(cin, 4, 3, padding=1, qconfig=get_default_qat_qconfig("fbgemm"))


OVERRIDING = [
    ("ConvBn2d", _qat(nniqat.ConvBn2d), "overrides forward"),
    ("ConvReLU2d", _qat(nniqat.ConvReLU2d), "overrides forward"),
    ("UserConv", lambda: UserConv(3, 4, 3, padding=1), "overrides forward"),
    ("UserConvForward", lambda: UserConvForward(3, 4, 3, padding=1), "overrides _conv_forward"),
]


@pytest.mark.parametrize(("name", "factory", "words"), OVERRIDING, ids=[n for n, *_ in OVERRIDING])
def test_classes_that_override_forward_keep_it(name: str, factory, words: str) -> None:  # noqa: ANN001
    module = factory()
    reason = impls.class_reason(module)
    assert reason is not None and name in reason and words in reason
    for impl in ("unfold_gemm", "triton", "fold_time"):
        assert impls.why_not(impl, module, device=CPU, dtype=torch.float32) == reason
        with pytest.raises(ImplError, match=words):
            impls.swap(module, impl)
    assert type(impls.swap(module, "native")) is type(module)


def test_global_knobs_apply_and_overriding_layers_stay_native() -> None:
    """conv_impl=unfold_gemm on a model of every kind: the plain and Lazy convs are swapped, the
    classes that override forward keep it (no warning: a global knob, not a layer named in a
    config), and the model computes what the untouched one does."""
    torch.manual_seed(0)
    model = nn.Sequential(_qat(nniqat.ConvBn2d)(), _qat(nniqat.ConvReLU2d, 4)(), UserConv(4, 4, 3),
                          UserConvForward(4, 4, 3), nn.LazyConv2d(4, 3), nn.Conv2d(4, 4, 1))  # fmt: skip
    x = torch.randn(2, 3, 8, 8)
    model.train()
    untouched = copy_module(model)
    torch.manual_seed(1)  # the Lazy conv draws its weights at its first call: the same in both
    want = untouched(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdvisorWarning)
        tuned = apply_settings(Settings(conv_impl="unfold_gemm", memory_format="channels_last"),
                               model, CPU, warn=False)  # fmt: skip
    try:
        assert [tuned.layer_impls[str(i)] for i in range(6)] == ["native"] * 4 + ["unfold_gemm"] * 2
        assert [type(m) for m in model[:4]] == [type(m) for m in untouched[:4]]
        torch.manual_seed(1)
        got = tuned.model(*tuned.inputs(x))
        assert type(model[4]).__name__ == "UnfoldGemmConv2d"  # the Lazy conv became a Conv2d
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        tuned.restore()


def test_a_config_naming_an_overriding_layer_warns_and_keeps_it() -> None:
    model = nn.Sequential(UserConv(3, 4, 3), nn.Conv2d(4, 4, 3))
    with pytest.warns(AdvisorWarning, match="'0': unfold_gemm cannot run here .*UserConv overrides"):
        tuned = apply_settings(Settings(layers={"0": "unfold_gemm", "1": "unfold_gemm"}), model, CPU)
    tuned.restore()
    assert tuned.layer_impls == {"0": "native", "1": "unfold_gemm"}
    assert type(model[0]) is UserConv


def test_lazy_convs() -> None:
    """Swapped before its first call, a Lazy conv is computed by the implementation from then on;
    one given its weights by load_state_dict (in_channels left 0 by PyTorch) is described by
    its weight's shape."""
    torch.manual_seed(0)
    lazy = nn.LazyConv2d(4, 3, padding=1)
    assert impls.class_reason(lazy) is None
    out = compare(lazy, "unfold_gemm", torch.randn(2, 3, 6, 6))
    assert out.worst < 1e-5, out.errors
    loaded = nn.LazyConv2d(4, 3, groups=1)
    loaded.load_state_dict(nn.Conv2d(6, 4, 3).state_dict())
    assert loaded.in_channels == 0
    assert ConvSignature.from_module(loaded).in_channels == 6
    assert spec_from_module(loaded, (1, 6, 5, 5)).in_channels == 6
    swapped = impls.swap(loaded, "unfold_gemm")
    swapped(torch.randn(1, 6, 5, 5))
    assert original_class(swapped) is nn.Conv2d
