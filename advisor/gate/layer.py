"""The numeric gate's sharp check: each conv layer alone, against float64 (or fp32 for a reduced
precision: `FP32_REFERENCE_FROM`).

A conv is linear, so its output and both gradients on random inputs are a sharp test of an
implementation or a precision: a kernel tap off or a weight off by 1e-3 shows at once, whatever
the model around it does. Every conv layer of a candidate's model is run alone with the input it
receives there (shape, dtype, layout, whether it needs a gradient), under the candidate's flags
and autocast, and compared with the same layer in float64; the tolerance per precision is the
space's `layer_tolerances`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from advisor import impls
from advisor.device.ops import autocast_type, cuda_ops, placement
from advisor.gate.metrics import global_rel_error, rel_error
from advisor.knobs import GlobalFlags, Settings
from advisor.measure.candidate import Candidate, ConvInput, Mode, engine_grads, to_layout
from advisor.space import SearchSpace
from advisor.workload.copying import copy_module

__all__ = ["GateContext", "LayerCheck", "LayerVerdict"]

# A reference 100x finer than the tolerance it judges is as good as an exact one: below this
# tolerance (the fp32 class, 1e-4) the layers run in float64; above it (TF32 2e-3, fp16 3e-3,
# bf16 1e-2) in fp32 with TF32 off, IEEE, native kernels, whose error (1e-7 to 1e-5 on the
# longest reductions) is at most 0.5% of the tolerance. On a CPU float64 convs have no oneDNN
# kernel and take about 5x fp32's time.
FP32_REFERENCE_FROM = 1e-3
_CACHE_BYTES = 512 * 2**20  # float64 layer references kept for the next candidate (CPU RAM)
_CACHE_SHARE = 0.025  # on a GPU: this share of its memory, up to 2 GiB (a float64 conv on a
_CACHE_MAX = 2 * 2**30  # large layer costs each candidate a second otherwise)


@dataclass(frozen=True)
class LayerVerdict:
    """The worst conv layer of a candidate, checked alone against float64."""

    error: float
    tolerance: float
    layer: str
    what: str  # output, input gradient or weight gradient

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


class GateContext(Protocol):
    """What a layer check needs of its gate (`gate.Gate` is one): where and how the candidates
    run, and which precision class and own path a candidate has."""

    device: torch.device
    mode: Mode
    seed: int
    space: SearchSpace

    def precision(self, settings: Settings) -> str: ...

    def own_path(self, settings: Settings) -> Settings: ...


class LayerCheck:
    """Each conv layer of a candidate alone against float64, for one gate: the float64
    references are kept (within a budget) for the candidates after the first."""

    def __init__(self, gate: GateContext) -> None:
        self.gate = gate
        self._layer_refs: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}
        self._draws: dict[tuple[Any, ...], tuple[torch.Tensor, Any]] = {}
        self._layer_ref_bytes = 0
        self._cache_bytes = _CACHE_BYTES
        device = gate.device
        if device.type == "cuda":
            total = cuda_ops().properties(cuda_ops().index_of(device)).total_memory
            self._cache_bytes = min(_CACHE_MAX, int(_CACHE_SHARE * total))

    def check(self, cand: Candidate, convs: list[ConvInput]) -> LayerVerdict | None:
        """The worst conv layer of `cand` run alone against float64 (None: the model has none):
        a failing layer before any passing one, else the largest error.

        At PyTorch's default precision on this device (TF32 convs on CUDA) a layer may differ as
        much as `yardstick_factor` x PyTorch's own kernel for it at that precision: the user runs
        that kernel already (a large-K conv's TF32 error can exceed the space's tolerance)."""
        settings = cand.tuned.settings
        tol = self.gate.space.layer_tolerances.for_precision(self.gate.precision(settings))
        default = (
            self.gate.precision(settings) != "fp32" and self.gate.own_path(settings) == Settings()
        )
        verdicts: list[LayerVerdict] = []
        ref_dtype = torch.float64 if tol < FP32_REFERENCE_FROM else torch.float32
        for c in convs:
            errors = self._layer_errors(cand, c, c.module, ref_dtype)
            limit = dict.fromkeys(errors, tol)
            if default and any(err > tol for err in errors.values()):
                native = impls.swap(copy_module(c.module), "native")
                own = self._layer_errors(cand, c, native, ref_dtype)
                factor = self.gate.space.gate.yardstick_factor
                limit = {what: max(tol, factor * own[what]) for what in errors}
            verdicts += [LayerVerdict(err, limit[w], c.name, w) for w, err in errors.items()]
        failing = [v for v in verdicts if not v.ok]
        return max(failing or verdicts, key=lambda v: v.error, default=None)

    def _layer_errors(
        self, cand: Candidate, c: ConvInput, module: nn.Module, ref_dtype: torch.dtype
    ) -> dict[str, float]:
        train = self.gate.mode == "train"
        need_x = train and c.requires_grad
        # Drawn where the layer runs, from the same seed for every candidate: on a GPU a CPU
        # draw (and its copy) of a large layer's input and output gradient costs seconds per
        # candidate.
        x32, gen = self._draw_input(c.shape)
        x = x32.to(c.dtype, copy=True)  # the kept draw never reaches a module
        xd = to_layout(x, c.layout).requires_grad_(need_x)
        # All the layer's parameters: a weight-normed conv's are its parametrization's originals.
        params = {n: p for n, p in module.named_parameters() if train and p.requires_grad}
        # A layer whose buffers change on each call (QAT's observers, ConvBn's batch norm, a
        # spectral norm's power iteration) is judged against a copy of itself from before the
        # call, not against a reference cached from another candidate's state.
        before = copy_module(module) if next(module.buffers(), None) is not None else None
        with torch.set_grad_enabled(train), cand.tuned.autocast():
            out = module(xd)
        got = {"output": out.detach()}
        g = None
        if train:
            g = self._draw_grad(c.shape, out.shape, gen).to(out.dtype)
            wrt = [xd] if need_x else []
            grads = engine_grads([out], [g], [*wrt, *params.values()])
            if need_x:
                got["input gradient"] = grads[0]
            for n, gr in zip(params, grads[len(wrt) :], strict=True):
                got[f"param.{n}"] = gr
        ref = self._layer_reference(c, x, g, need_x, list(params), before, ref_dtype)
        errors = {
            "output": rel_error(got["output"], ref["output"]),
        }
        if "input gradient" in got:
            errors["input gradient"] = rel_error(got["input gradient"], ref["input gradient"])
        pgot = {k: v for k, v in got.items() if k.startswith("param.")}
        if pgot:
            pref = {k: ref[k] for k in pgot}
            errors["weight gradient"] = global_rel_error(pgot, pref)
        return errors

    def _draw_input(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Generator]:
        """A layer's input drawn in float32 (the same for every candidate and every layer of this
        shape: from the seed) and the generator after it, which draws the output gradient. Kept
        beside the references, so each later candidate does not pay the draw again."""
        where = placement(self.gate.device)
        gen = torch.Generator(device=where).manual_seed(self.gate.seed + 17)
        hit = self._draws.get(("input", tuple(shape)))
        if hit is not None:
            gen.set_state(hit[1])
            return hit[0], gen
        x = torch.randn(shape, generator=gen, dtype=torch.float32, device=where)
        self._keep(("input", tuple(shape)), (x, gen.get_state()))
        return x, gen

    def _draw_grad(
        self, in_shape: tuple[int, ...], shape: tuple[int, ...], gen: torch.Generator
    ) -> torch.Tensor:
        """The output gradient drawn after the input of `in_shape`, in float32 (kept likewise)."""
        key = ("grad", tuple(in_shape), tuple(shape))
        hit = self._draws.get(key)
        if hit is not None:
            return hit[0]
        g = torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device)
        self._keep(key, (g, None))
        return g

    def _keep(self, key: tuple[Any, ...], draw: tuple[torch.Tensor, Any]) -> None:
        """Keep a draw within the references' budget (they share it)."""
        size = draw[0].numel() * draw[0].element_size()
        if self._layer_ref_bytes + size <= self._cache_bytes:
            self._draws[key] = draw
            self._layer_ref_bytes += size

    def _layer_reference(
        self,
        c: ConvInput,
        x: torch.Tensor,
        g: torch.Tensor | None,
        need_x: bool,
        params: list[str],
        before: nn.Module | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> dict[str, torch.Tensor]:
        """The layer (`before`, else the candidate's) in `dtype` with native kernels on the same
        values (cached, within a budget: candidates in one precision share it; not `before`). A
        layer that cannot run in float64 (QAT's fake quantisation) is judged in float32, IEEE,
        as are the reduced precisions (`FP32_REFERENCE_FROM`)."""
        key = (c.name, c.shape, x.dtype, None if g is None else g.dtype, need_x, tuple(params),
               dtype)  # fmt: skip
        hit = self._layer_refs.get(key) if before is None else None
        if hit is not None:
            return hit
        layer = before if before is not None else c.module
        ref = None
        if dtype == torch.float64:
            with contextlib.suppress(RuntimeError):
                ref = self._reference_in(torch.float64, layer, x, g, need_x, params)
        if ref is None:
            with GlobalFlags() as flags:
                flags.apply(Settings(tf32="off"), self.gate.device)
                ref = self._reference_in(torch.float32, layer, x, g, need_x, params)
        if before is not None:
            return ref
        size = sum(t.numel() * t.element_size() for t in ref.values())
        if self._layer_ref_bytes + size <= self._cache_bytes:
            self._layer_refs[key] = ref
            self._layer_ref_bytes += size
        return ref

    def _reference_in(
        self,
        dtype: torch.dtype,
        layer: nn.Module,
        x: torch.Tensor,
        g: torch.Tensor | None,
        need_x: bool,
        params: list[str],
    ) -> dict[str, torch.Tensor]:
        ref_mod = impls.swap(copy_module(layer), "native").to(dtype)
        xr = x.to(placement(self.gate.device), dtype).requires_grad_(need_x)
        autocast_off = torch.autocast(autocast_type(self.gate.device), enabled=False)
        with autocast_off, torch.set_grad_enabled(g is not None):
            out = ref_mod(xr)
        ref = {"output": out.detach()}
        if g is not None:
            named = dict(ref_mod.named_parameters())
            wrt = ([xr] if need_x else []) + [named[n] for n in params]
            grads = engine_grads([out], [g.to(out.device, dtype)], wrt)
            if need_x:
                ref["input gradient"] = grads[0]
            for n, gr in zip(params, grads[1 if need_x else 0 :], strict=True):
                ref[f"param.{n}"] = gr
        return ref
