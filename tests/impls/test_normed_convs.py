"""Weight-normed and spectral-normed convs through every implementation, against PyTorch in
float64: the parametrization form (torch.nn.utils.parametrizations: `ParametrizedConv2d`, the
weight a property) and the old hook-based form (torch.nn.utils.weight_norm / spectral_norm: a
forward pre-hook sets the weight). The weight is computed as parametrized on each call, the
gradients reach the originals (original0/original1, weight_g/weight_v, weight_orig), and the
module stays what the user built: its class, its state_dict keys, its parametrization."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import advisor
from advisor import impls
from advisor.config import Config
from advisor.device.environment import current_environment
from advisor.impls._swap import original_class
from advisor.knobs import Settings
from advisor.workload.copying import copy_module
from tests.impls.swap_check import compare

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def _hook_weight_norm(m: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, and still in many models
        return torch.nn.utils.weight_norm(m)


NORMS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "weight_norm": parametrizations.weight_norm,
    "spectral_norm": parametrizations.spectral_norm,
    "hook_weight_norm": _hook_weight_norm,
    "hook_spectral_norm": torch.nn.utils.spectral_norm,
}
# (impl, layer it takes, input shape); triton through its interpreter on CPU tensors
LAYERS = [
    ("unfold_gemm", lambda: nn.Conv1d(4, 6, 5, padding=2, groups=2), (2, 4, 11)),
    ("unfold_gemm", lambda: nn.Conv2d(3, 5, 3, stride=2, padding=1), (2, 3, 9, 9)),
    ("unfold_gemm", lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1), (2, 4, 5, 5)),
    ("triton", lambda: nn.Conv2d(3, 4, 3, padding=1), (1, 3, 5, 5)),
    ("fold_time", lambda: nn.Conv3d(2, 4, (1, 3, 3), padding=(0, 1, 1)), (1, 2, 3, 6, 6)),
    ("transpose_as_mul", lambda: nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2), (2, 4, 3, 3)),
]
ORIGINALS = {
    "weight_norm": {"parametrizations.weight.original0", "parametrizations.weight.original1"},
    "spectral_norm": {"parametrizations.weight.original"},
    "hook_weight_norm": {"weight_g", "weight_v"},
    "hook_spectral_norm": {"weight_orig"},
}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _normed(norm: str, factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return NORMS[norm](factory())


@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize(("impl", "factory", "shape"), LAYERS, ids=[f"{i}-{n}" for n, (i, _, _) in
                                                                    enumerate(LAYERS)])  # fmt: skip
def test_normed_conv_matches_pytorch_in_float64(impl: str, factory, shape, norm: str) -> None:  # noqa: ANN001
    # Triton computes float32 (against float64 too), the others float64 itself.
    dtype, tol = (torch.float32, 1e-5) if impl == "triton" else (torch.float64, 1e-10)
    if impl == "triton":
        pytest.importorskip("triton")
    module = _normed(norm, factory).to(dtype)
    assert impls.why_not(impl, module, device=CPU, dtype=dtype) is None
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    out = compare(module, impl, x)
    # every gradient is the originals': the parametrized weight itself is no parameter
    grads = {name.removesuffix(" grad") for name in out.errors} - {"output", "input", "bias"}
    assert grads == ORIGINALS[norm]
    assert out.fallbacks == 0 and out.worst < tol, out.errors


@pytest.mark.parametrize("norm", list(NORMS))
def test_the_weight_is_parametrized_on_each_call(norm: str) -> None:
    """A change to the originals after the swap shows in the next call, as in PyTorch's."""
    plain = _normed(norm, lambda: nn.Conv2d(3, 4, 3)).double().eval()
    swapped = impls.swap(copy_module(plain), "unfold_gemm")
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    for step in range(2):
        torch.testing.assert_close(swapped(x), plain(x), rtol=1e-12, atol=1e-12)
        with torch.no_grad():  # the same change to both copies' originals
            for (n, p), (_, q) in zip(plain.named_parameters(), swapped.named_parameters()):
                if n != "bias":
                    p.mul_(1.5 + step).add_(0.1)
                    q.copy_(p)


@pytest.mark.parametrize("norm", ["weight_norm", "spectral_norm"])
def test_apply_keeps_the_module_as_built(norm: str) -> None:
    """advisor.apply swaps a parametrized conv in place: still the user's parametrized class, same
    parameters and state_dict keys, and native gives the very class back."""
    model = nn.Sequential(_normed(norm, lambda: nn.Conv2d(3, 4, 3)), nn.ReLU())
    before_cls, keys = type(model[0]), list(model.state_dict())
    params = list(model.parameters())
    settings = Settings(layers={"0": "unfold_gemm"})
    cfg = Config(advisor_version=advisor.__version__, mode="train", settings=settings,
                 environment=current_environment(CPU), workload={"kind": "model"},
                 space="per_layer_cpu")  # fmt: skip
    with advisor.apply(cfg, model, device="cpu") as tuned:
        assert tuned.layer_impls == {"0": "unfold_gemm"}
        conv = model[0]
        assert isinstance(conv, before_cls) and original_class(conv) is before_cls
        assert parametrize.is_parametrized(conv, "weight")
        assert list(model.state_dict()) == keys
        assert all(a is b for a, b in zip(model.parameters(), params))
        model(torch.randn(1, 3, 5, 5)).sum().backward()
        assert all(p.grad is not None for p in params)
    impls.swap(conv, "native")
    assert type(conv) is before_cls
