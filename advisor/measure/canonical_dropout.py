"""Dropout masks that do not depend on dtype, memory layout or device, for the numeric gate.

The gate compares a candidate's training step with the fp32 reference's, both seeded alike. But
PyTorch draws a dropout mask in memory order, with a vector width that depends on the dtype on
CUDA (4 fp32 values per thread, 8 fp16/bf16, 2 fp64): a channels_last candidate (on a CPU too) or
an AMP one (on CUDA) drops other units than the reference, and the comparison would measure two
masks, not two precisions.

While `canonical_dropout()` is active, every dropout function (`nn.Dropout*`, `nn.AlphaDropout`,
`nn.FeatureAlphaDropout` and their functional forms) draws its mask on the CPU, in fp32, in the
tensor's logical order, from a seed and its call number: the same units in every candidate. A
dropout is affine in its input for a fixed mask, `out = x * a + b` (`b = 0` but for the alpha
variants), so `a` and `b` come from running PyTorch's own function on ones and zeros under that
seed. Only the gate's captures use it; timed steps run PyTorch's own kernels.

Around a compiled model Dynamo traces the mode into the model's graph, which must stay one graph as
under the user's own `torch.compile`. Drawing the mask under `fork_rng`/`manual_seed` cannot be
traced: it breaks the graph inside the mode, and Dynamo then compiles the mode's
`__torch_function__` once per torch call of the step, each op a graph of its own. An in-place
activation is then a graph mutating its input, and an in-place dropout after it
(`Hardswish(inplace=True)`, `Dropout(inplace=True)`: MobileNetV3's classifier) makes the backward
fail ("modified by an inplace operation") on a model that trains compiled. So the mask is drawn by a
custom op (`advisor::canonical_dropout_affine`): opaque to Dynamo and Inductor, it runs eagerly
inside the compiled graph, with the same seed and call number as in eager mode. Eager calls skip the
op and run its function directly: a custom op's first call imports Dynamo (about 1.4 s of a
process's time on a 2-core CPU). A graph break in the
model itself does the same under any TorchFunctionMode (Dynamo compiles the mode per op after it):
an in-place activation before an in-place dropout still fails there, in the gate's capture only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["canonical_dropout"]

_DROPOUTS: tuple[Callable[..., Any], ...] = (
    F.dropout,
    F.dropout1d,
    F.dropout2d,
    F.dropout3d,
    F.alpha_dropout,
    F.feature_alpha_dropout,
)
_SIGNATURES = {f: inspect.signature(f) for f in _DROPOUTS}
_BY_NAME = {f.__name__: f for f in _DROPOUTS}


def _affine(name: str, shape: list[int], p: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`a`, `b` (fp32, on the CPU) with `name`(x) == x * a + b for the mask drawn under `seed`."""
    func = _BY_NAME[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ones = func(torch.ones(shape), p=p, training=True)
        torch.manual_seed(seed)
        zeros = func(torch.zeros(shape), p=p, training=True)
    return ones - zeros, zeros


affine = torch.library.custom_op("advisor::canonical_dropout_affine", _affine, mutates_args=())


@affine.register_fake
def _(name: str, shape: list[int], p: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(shape), torch.empty(shape)


class canonical_dropout(TorchFunctionMode):  # noqa: N801 - used as a context manager
    """Within it, dropout masks depend only on `seed`, the call's order and the logical shape."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.calls = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _SIGNATURES:
            return func(*args, **kwargs)
        bound = _SIGNATURES[func].bind(*args, **kwargs)
        bound.apply_defaults()
        x, p = bound.arguments["input"], bound.arguments["p"]
        if not bound.arguments["training"] or p == 0 or not torch.is_tensor(x):
            return func(*args, **kwargs)
        self.calls += 1
        draw = affine if torch.compiler.is_compiling() else _affine  # the op for Dynamo only
        a, b = draw(func.__name__, list(x.shape), p, self.seed * 100_003 + self.calls)
        a, b = a.to(x.device, x.dtype), b.to(x.device, x.dtype)
        if bound.arguments["inplace"]:  # as PyTorch's: the input itself, changed
            return x.mul_(a).add_(b)
        return x * a + b
