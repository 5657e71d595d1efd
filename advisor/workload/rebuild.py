"""A workload rebuilt from its description: in an isolated worker, in the final check's fresh
process, and in the benchmarks that re-time a config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from advisor.errors import ModelFileError
from advisor.workload.build import Workload, layer_from_source, layer_workload, model_workload
from advisor.workload.info import LayerInfo, ModelFileInfo, WorkloadInfo, parse_info
from advisor.workload.shape_sets import with_shape_set

__all__ = ["workload_from_info"]


def workload_from_info(info: WorkloadInfo | Mapping[str, Any]) -> Workload:
    """Rebuild a workload from its description (isolated workers; benchmarks re-timing a config).

    Takes the typed info, its JSON, or a config file's `workload`."""
    info = parse_info(info)
    base: Workload
    if isinstance(info, LayerInfo):
        spec = info.spec
        base = layer_workload(spec) if info.source is None else layer_from_source(spec, info.source)
    elif isinstance(info, ModelFileInfo):
        base = model_workload(info.target, build=info.build, inputs=info.inputs)
    else:
        raise ModelFileError(f"cannot rebuild workload {info.description!r} in a worker")
    ss = info.shape_set
    if ss:
        base = with_shape_set(
            base, shapes=ss.shapes, batch_sizes=ss.batch_sizes, weights=ss.weights
        )
    return base
