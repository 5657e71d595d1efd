"""A model file's workload known by its description before it is loaded in this process.

An isolated run loads and runs the model file first in a probe's child (`advisor.execute.probe`),
which goes on as the run's worker: the search, the gate and the re-times run there. The advise
process itself needs the model only for the per-layer stage (its conv layers and their shapes)
and for in-process checks; for the rest (the study's key, the candidates, the config file) the
description the probe sends back is enough. Loading the file here again costs its imports a
second time (MONAI's take longer than a whole quick search, which needs no model here at all),
so the model and its inputs are loaded on first use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from advisor.device.global_state import global_state_kept
from advisor.workload.build import ShapeCase, Workload
from advisor.workload.info import ModelFileInfo, parse_info
from advisor.workload.rebuild import workload_from_info

__all__ = ["DeferredWorkload"]


class DeferredWorkload(Workload):
    """A model file's workload from its description (`info`, as a probe's child loaded it) and
    its parameters' dtype: `make_model`, the example inputs and the shape cases are loaded from
    the file on first use (`load_s` says how long that took; `on_load` is told). What the file
    sets globally at import (TF32, cudnn flags) is undone after the load, as at start-up."""

    info: ModelFileInfo

    def __init__(
        self,
        info: ModelFileInfo | Mapping[str, Any],
        param_dtype: torch.dtype,
        on_load: Callable[[float], None] | None = None,
    ) -> None:
        # Workload's own __init__ is not called: its model fields are the properties below.
        parsed = parse_info(info)
        if not isinstance(parsed, ModelFileInfo):
            raise TypeError(f"only a model file's load is deferred, not a {type(parsed).__name__}")
        self.name, self.info = parsed.description, parsed
        self.__dict__["param_dtype"] = param_dtype  # Workload.param_dtype's cache, filled
        self.on_load = on_load
        self.load_s: float | None = None  # None: not loaded here (yet)
        self._loaded: Workload | None = None

    def __repr__(self) -> str:
        state = "loaded" if self._loaded is not None else "not loaded yet"
        return f"DeferredWorkload({self.name!r}, {state})"

    @property
    def loaded(self) -> Workload:
        """The workload loaded from the file (once)."""
        if self._loaded is None:
            t0 = time.perf_counter()
            with global_state_kept():
                self._loaded = workload_from_info(self.info)
            self.load_s = time.perf_counter() - t0
            if self.on_load is not None:
                self.on_load(self.load_s)
        return self._loaded

    @property
    def input_shapes(self) -> list[list[int]]:
        return [list(shape) for shape in self.info.input_shapes]  # as the probe's child saw them

    @property
    def shape_weights(self) -> tuple[float, ...]:
        """From the description: combining the workers' measurements loads nothing here (loading
        a large model again for its weights would cost most of the combining's time)."""
        shape_set = self.info.shape_set
        return tuple(float(w) for w in shape_set.weights) if shape_set is not None else (1.0,)

    # Workload's model fields, read from the loaded workload.
    @property
    def make_model(self) -> Callable[[], nn.Module]:  # type: ignore[override]
        return self.loaded.make_model

    @property
    def example_inputs(self) -> tuple[Any, ...]:  # type: ignore[override]
        return self.loaded.example_inputs

    @property
    def example_kwargs(self) -> Mapping[str, Any]:  # type: ignore[override]
        return self.loaded.example_kwargs

    @property
    def cases(self) -> tuple[ShapeCase, ...]:  # type: ignore[override]
        return self.loaded.cases

    @property
    def input_grad(self) -> tuple[bool, ...]:  # type: ignore[override]
        return self.loaded.input_grad

    @property
    def input_layout(self) -> str | None:  # type: ignore[override]
        return self.loaded.input_layout
