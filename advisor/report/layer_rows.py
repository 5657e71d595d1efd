"""The report's per-layer rows, read from a study's companion "<study>/layers", and the optional
roofline column: the fraction of the roofline floor a layer reached on this machine."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = ["default_precision", "layer_rows", "roofline_of"]


def layer_rows(layers: optuna.Study | None, mode: str, env: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-layer measurements from the companion study: one row per layer group and impl."""
    from advisor.measure.results import TrialResult

    if layers is None:
        return []
    rows = []
    for t in layers.get_trials(deepcopy=False):
        a = t.user_attrs  # as `advisor.stages.per_layer` stores them
        r = TrialResult.model_validate(a["result"])
        row: dict[str, Any] = {
            "layer": f"{', '.join(a['names'])}: {a['description']}",  # '0, 2: Conv3d(...) on ...'
            "impl": str(a["impl"]),
            # the global settings it ran under: a resume under others measures layers again
            "under": r.settings.global_only().label(),
            "status": r.status,
            "median_ms": r.median_ms if r.measurement else math.nan,
            "reason": r.reason or "",
        }
        if r.measurement is not None:
            row["roofline"], row["roofline_at"] = roofline_of(
                a["spec"], mode, r.median_ms, env, r.precision
            )
        rows.append(row)
    return rows


def roofline_of(
    spec: dict[str, Any], mode: str, median_ms: float, env: dict[str, Any], precision: str
) -> tuple[float | None, str]:
    """(fraction of the roofline floor a layer reached, the precision its peak and bytes were
    taken at), against the peak of the precision it was measured in (its trial's `precision`)
    when this is the machine it was tuned on (peaks measured elsewhere would be meaningless).
    (None, why) where there is no such peak here, e.g. 'tf32 n/a on cpu'; (None, '') when the
    machine differs or the spec does not load."""
    from advisor.device.environment import current_environment
    from advisor.measure import roofline
    from advisor.workload.layer_spec import DTYPES

    try:
        device = str(env.get("device_type", "cpu"))
        if current_environment(device).fingerprint != env.get("fingerprint"):
            return None, ""
        at = roofline.layer_precision(precision, DTYPES[str(spec.get("dtype", "float32"))])
        problem = roofline.peak_problem(at, device)
        if problem is not None:
            return None, problem
        return float(roofline.layer_fraction(spec, mode, median_ms, device, at)), at
    except Exception:  # noqa: BLE001 - an optional column: never fail the report for it
        return None, ""


def default_precision(spec: dict[str, Any], env: dict[str, Any]) -> str:
    """The precision PyTorch's default computes a layer spec in, on the machine of `env`."""
    import torch

    from advisor.knobs import Settings, precision_of
    from advisor.workload.layer_spec import DTYPES

    device = torch.device(str(env.get("device_type", "cpu")))
    return precision_of(Settings(), device, DTYPES[str(spec.get("dtype", "float32"))])
