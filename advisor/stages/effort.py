"""Effort levels: how much of the pipeline a run spends, by the question the user asks.

- **quick** answers "which flags?": the global knobs only (memory format, precision, TF32,
  the CPU's fp32 mode), each screened before it is timed in full, then cudnn.benchmark on the
  best two (`advisor.stages.benchmark_twins`; three at full effort); no per-layer
  stage and no compile. The pick's final check runs only where its margin over the default is
  within noise in the re-time: a margin beyond noise there is already the answer.
- **default** runs every stage, compile included, with torch.compile's "default" mode only; the
  global knobs are screened as at quick; the eager answer is checked and written before the
  compile stage starts.
- **full** spends more where it can pay: no screen (every candidate timed in full), every
  compile mode the space lists (and max-autotune on
  a GPU, where Inductor has conv templates), every layer group in the per-layer stage, twice the
  samples per candidate and one more finalist in the re-times, within twice the time budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from advisor.errors import AdvisorError
from advisor.space import SearchSpace

EffortName = Literal["quick", "default", "full"]
EFFORTS: tuple[EffortName, ...] = ("quick", "default", "full")

# quick's timing: a global knob's win is a whole-model step; 5 samples within half a second give
# its median to a few % on a quiet machine, and the re-time and the final check (where it runs)
# decide what the search leaves close.
QUICK_MIN_SAMPLES = 5
QUICK_MAX_TIME_S = 0.5
# cudnn.benchmark is tried on this many finalists of the benchmark-off search, the best first:
# each new dtype and layout pays cuDNN's search once more (seconds a candidate on a GPU).
# Two even at quick: finalists within noise of each other gain unequally from the flag, so one
# twin would find the pick only by the search's order.
BENCHMARK_FINALISTS: dict[EffortName, int] = {"quick": 2, "default": 2, "full": 3}
# Modes compiled at default effort; full takes every mode the space lists.
DEFAULT_COMPILE_MODES = ("default",)
# A GPU's extra mode at full effort: Inductor autotunes conv templates there (not on a CPU,
# where it has GEMM templates only: search_spaces/cpu.yaml).
FULL_GPU_MODE = "max-autotune"


@dataclass(frozen=True)
class Effort:
    """What one effort level changes in a run."""

    name: EffortName

    @property
    def screens(self) -> bool:
        """Candidates are screened (a few steps each, all of them) before the full timing;
        full times every candidate in full."""
        return self.name != "full"

    @property
    def benchmark_finalists(self) -> int:
        """How many of the eager search's best accepted candidates are tried again with
        cudnn.benchmark on (`advisor.stages.benchmark_twins`): each pays cuDNN's search."""
        return BENCHMARK_FINALISTS[self.name]

    @property
    def every_layer_group(self) -> bool:
        return self.name == "full"

    @property
    def eager_first(self) -> bool:
        """The eager answer is checked and written before the compile stage starts."""
        return self.name != "quick"

    @property
    def check_always(self) -> bool:
        """The final check runs whatever the re-time's margin (quick: only within noise)."""
        return self.name != "quick"

    def note(self) -> str | None:
        """What this effort left out, for the advice's notes."""
        if self.name == "quick":
            return ("quick effort: the global settings only; per-layer implementations and "
                    "torch.compile were not tried (--effort default tries them)")  # fmt: skip
        return None

    def space(self, sp: SearchSpace, device: torch.device) -> SearchSpace:
        """The search space this effort runs: the user's, narrowed (quick, default's compile
        modes) or widened (full)."""
        knobs = dict(sp.knobs)
        update: dict[str, object] = {}
        if self.name == "quick":
            knobs["conv_impl"] = ["native"]
            knobs["compile"] = ["off"]
            update["per_layer"] = False
            update["timing"] = sp.timing.model_copy(update={
                "min_samples": min(sp.timing.min_samples, QUICK_MIN_SAMPLES),
                "max_time_s": min(sp.timing.max_time_s, QUICK_MAX_TIME_S),
            })  # fmt: skip
        elif self.name == "default":
            modes = knobs.get("compile", ["off"])
            knobs["compile"] = [m for m in modes if m == "off" or m in DEFAULT_COMPILE_MODES]
        else:
            modes = list(knobs.get("compile", ["off"]))
            if device.type == "cuda" and len(modes) > 1 and FULL_GPU_MODE not in modes:
                modes.append(FULL_GPU_MODE)
            knobs["compile"] = modes
            t = sp.timing
            update["timing"] = t.model_copy(update={
                "min_samples": min(2 * t.min_samples, t.max_samples),
                "max_time_s": 2 * t.max_time_s,
            })  # fmt: skip
            update["retime_top"] = sp.retime_top + 1 if sp.retime_top else 0
            update["budget"] = sp.budget.model_copy(update={"time_s": 2 * sp.budget.time_s})
        if "compile" not in sp.knobs:
            knobs.pop("compile", None)  # a space without the knob keeps PyTorch's eager default
        elif not knobs["compile"]:
            knobs["compile"] = ["off"]
        if "conv_impl" not in sp.knobs:
            knobs.pop("conv_impl", None)
        update["knobs"] = knobs
        return sp.model_copy(update=update)


def effort_of(name: str) -> Effort:
    if name not in EFFORTS:
        raise AdvisorError(f"unknown effort {name!r}; use {', '.join(EFFORTS)}")
    return Effort(name)
