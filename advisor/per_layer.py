"""Per-layer implementation choice for models: the second stage of the search.

After the global knobs are chosen, each conv layer is timed alone (with its input shape as seen in
the model, under the chosen settings) with every implementation that qualifies for it; layers with
the same signature and input shape share one measurement. The fastest beyond noise wins per layer
(ties go to `native`). The combination is then measured on the whole model and kept only if it
beats the global-knob winner beyond noise.

Measurements are stored in a companion study ("<study>/layers", `storage.LayerStore`) so a
resumed search does not repeat them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from advisor import impls
from advisor.apply import compute_dtype
from advisor.candidate import Candidate, ConvInput, Mode
from advisor.evaluators import Evaluator
from advisor.knobs import Settings
from advisor.layer_spec import DTYPE_NAMES, LayerSpec
from advisor.pick import pick_best
from advisor.results import TrialResult
from advisor.space import SearchSpace
from advisor.storage import LayerStore, measured_under
from advisor.workload import Workload, layer_workload_from_module
from advisor.workload_info import LayerInfo


@dataclass(frozen=True)
class LayerGroup:
    """Conv layers that share a signature and an input shape: one measurement serves them all."""

    key: str
    names: tuple[str, ...]
    description: str
    workload: Workload

    @property
    def spec(self) -> LayerSpec:
        info = self.workload.info
        assert isinstance(info, LayerInfo)  # layer_groups makes layer workloads only
        return info.spec


@dataclass
class LayerChoice:
    group: LayerGroup
    results: dict[str, TrialResult]  # impl name -> result
    chosen: str
    why: str
    skipped: dict[str, str]  # impl name -> why it does not qualify


def conv_inputs(
    workload: Workload, settings: Settings, device: torch.device, mode: Mode
) -> dict[str, ConvInput]:
    """What every conv layer receives in the model under `settings`, from one step: its input's
    shape, dtype (bf16 activations under autocast), layout, and (train) whether it needs a
    gradient (not for a layer that takes the network's input)."""
    cand = Candidate(workload, settings, device, mode)
    try:
        return {c.name: c for c in cand.capture(record_convs=True).convs}
    finally:
        cand.close()


def layer_groups(
    workload: Workload, settings: Settings, device: torch.device, mode: Mode = "infer"
) -> list[LayerGroup]:
    """Conv layers grouped by signature and by what they receive: one measurement per group.

    Each group's layer workload has its first layer's weights; for a model file it also names
    where that layer lives, so an isolated worker rebuilds it with the same weights."""
    seen = conv_inputs(workload, settings, device, mode)
    model = workload.make_model()
    groups: dict[str, list[str]] = {}
    modules = dict(impls.conv_modules(model))
    for name, module in modules.items():
        if name not in seen:
            continue  # never called in the forward pass
        c = seen[name]
        sig = impls.ConvSignature.from_module(module)
        key = f"{sig}|{c.shape}|{c.dtype}|{c.layout}|grad={c.requires_grad}"
        groups.setdefault(key, []).append(name)
    out = []
    for key, names in groups.items():
        c = seen[names[0]]
        wl = layer_workload_from_module(
            modules[names[0]],
            c.shape,
            input_dtype=DTYPE_NAMES[c.dtype],
            input_layout=c.layout if c.layout != "strided" else "contiguous",
            input_grad=c.requires_grad,
            source=workload.info.layer_source(names[0]),
        )
        out.append(LayerGroup(key, tuple(names), wl.name, wl))
    return out


def choose_layer_impls(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    make_evaluator: Callable[[Workload], Evaluator],
    storage: Any,
    study_name: str,
    min_gain: float = 0.02,
    progress: Callable[[int, int, TrialResult | None], None] | None = None,
) -> list[LayerChoice]:
    """Time each qualifying implementation per layer group under `settings`; pick per group."""
    wanted = [n for n in space.knobs.get("conv_impl", ["native"]) if n in impls.names()]
    if wanted == ["native"] or not wanted:
        return []
    if "native" not in wanted:
        wanted = ["native", *wanted]
    groups = layer_groups(workload, settings, device, mode)
    store = LayerStore(storage, study_name)
    done = store.layer_results()
    plan: list[tuple[LayerGroup, list[str], dict[str, str]]] = []
    for g in groups:
        module = g.workload.make_model()
        dtype = compute_dtype(module, settings)
        usable, skipped = [], {}
        for name in wanted:
            reason = impls.why_not(name, module, device=device, dtype=dtype)
            if reason is None:
                usable.append(name)
            else:
                skipped[name] = reason
        plan.append((g, usable, skipped))
    total = sum(len(u) for _, u, _ in plan if len(u) > 1)
    count = 0
    choices = []
    for g, usable, skipped in plan:
        if len(usable) < 2:
            continue
        results: dict[str, TrialResult] = {}
        evaluator: Evaluator | None = None
        for name in usable:
            key = (g.key, name, measured_under(settings))
            if key not in done:
                if evaluator is None:
                    evaluator = make_evaluator(g.workload)
                res = evaluator(settings.model_copy(update={"conv_impl": name, "layers": {}}))
                store.add_layer_result(
                    res,
                    key=g.key,
                    impl=name,
                    names=list(g.names),
                    description=g.description,
                    spec=g.spec.model_dump(mode="json"),  # for per-layer roofline in reports
                )
                done[key] = res
            results[name] = done[key]
            count += 1
            if progress is not None:
                progress(count, total, results[name])
        if evaluator is not None:
            evaluator.close()
        base = results["native"]
        if base.status != "ok":
            chosen, why = "native", f"native failed on this layer ({base.reason}): kept"
        else:
            pick = pick_best(list(results.values()), base, min_gain)
            chosen = pick.chosen.settings.conv_impl
            why = pick.why
        choices.append(LayerChoice(g, results, chosen, why, skipped))
    return choices


def layers_map(choices: list[LayerChoice], default_impl: str = "native") -> dict[str, str]:
    """module name -> implementation, for layers whose choice differs from the default."""
    out = {}
    for c in choices:
        if c.chosen != default_impl:
            for name in c.group.names:
                out[name] = c.chosen
    return out
