"""The compile stage: torch.compile on the best eager settings, once the eager picture is in.

Candidates: each torch.compile mode the space lists for the device (`space.compile_modes`:
CPU default and max-autotune; CUDA default, max-autotune-no-cudagraphs, reduce-overhead),
applied to the best eager candidates (the eager pick and the fastest accepted one), in the
space's order of modes: not the cross product with every eager candidate, since a compile costs
seconds to minutes on a small CPU and the eager search has already ruled most settings out.
PyTorch's default settings compiled (what a user who only adds `torch.compile` gets) are measured
too, after the eager pick's compile, unless its eager time is out of a compile's reach: slower
than the best eager candidate's by more than the space's `compile_max_gain` (the most a compile
is assumed to speed up its eager twin; the built-in `cpu` space says 1.6x). On a CPU, a
contiguous candidate is compiled as its channels_last twin (`channels_last_twin`: Inductor runs
every conv in channels_last there), so the default and a channels_last pick share one compile.
A shape set tries each twice: `dynamic=False` (a graph per shape) and `dynamic=True` (one graph
for all).

Per-layer implementations are not compiled: a compiled candidate takes the global settings of
its eager twin with every conv on PyTorch's native kernel. Inductor lowers the whole graph and
fuses around its convs, so a layer's eager win measured alone does not carry into it, and the
Triton implementations are autograd Functions around kernels of their own (a config that names
both is still applied: `advisor.apply` swaps, then compiles).

Budget: the stage runs after the per-layer stage, until `deadline`; a candidate starts only when
the time left covers the longest compile trial so far (`FIRST_COMPILE_S` before the first).
Results are stored and enter the pick as every later candidate's (`advisor.stages.later`).
"""

from __future__ import annotations

import os
import sys

import torch

from advisor.device.flags import onednn_convs
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.search.options import SearchOutcome
from advisor.search.pick import decide
from advisor.space import Dropped, SearchSpace, compile_modes

__all__ = ["FIRST_COMPILE_S", "compile_candidates", "compile_race"]

# What a first compile trial is assumed to take before one was measured: a small model's cold
# compile on a small CPU (a large model's takes minutes), with the trial's samples and the gate's
# capture.
FIRST_COMPILE_S = 20.0


def compile_candidates(
    outcome: SearchOutcome,
    space: SearchSpace,
    device: torch.device,
    shape_set: bool,
    contest: Contest,
    layer: bool = False,
) -> list[Settings]:
    """The compiled candidates to measure, in order (see the module's docstring); the modes the
    device leaves out are added to the outcome's `dropped`, and all of them for a single `layer`
    (compiled alone, a conv is the same ATen call: compile is a whole-model setting)."""
    modes, dropped = compile_modes(space, device)
    if layer:
        why = "a whole-model setting: a single conv layer compiles to the same ATen call"
        dropped += [Dropped(f"compile={m}", why) for m in modes]
        modes = []
    for d in dropped:
        _note(outcome, d)
    if not modes:
        return []
    eager = decide(outcome.results, outcome.baseline, contest)
    bases: list[Settings] = []
    for r in (eager.chosen, eager.fastest, outcome.baseline):
        base = r.settings.global_only().eager()
        on = "PyTorch's default settings" if base == Settings() else base.label()
        out_of_reach = _out_of_reach(r, (eager.chosen, eager.fastest), contest)
        if out_of_reach is not None:
            if base not in bases:
                _note(outcome, Dropped(f"compile on {on}", out_of_reach))
            continue
        twin = channels_last_twin(base, outcome.results, space, device)
        if twin is not None:
            if base == Settings():  # what compile alone gives: the report says what stood in
                _note(outcome, Dropped(f"compile on {on}", _twin_why(twin)))
            base = twin
        if base not in bases:
            bases.append(base)
    dynamics: list[bool | None] = [False, True] if shape_set else [None]
    return [
        base.model_copy(update={"compile": mode, "compile_dynamic": dyn})
        for mode in modes
        for base in bases
        for dyn in dynamics
    ]


def _note(outcome: SearchOutcome, dropped: Dropped) -> None:
    """`dropped` in the outcome's list once (the pick, the fastest and the baseline are often
    the same settings)."""
    if dropped not in outcome.dropped:
        outcome.dropped.append(dropped)


def inductor_convs_channels_last(device: torch.device) -> bool:
    """Whether Inductor compiles every conv of a graph on `device` in channels_last, whatever
    the layout the model gives it: on a CPU with oneDNN, its layout optimisation does so for any
    graph with a conv (`GraphLowering.decide_layout_opt`, torch 2.4 to 2.13 at least)."""
    if device.type != "cpu":
        return False
    return _layout_optimization() and onednn_convs()


def _layout_optimization() -> bool:
    """Inductor's `config.layout_optimization`, read without importing Inductor where this
    process has not (importing Dynamo costs over a second in a process that compiles nothing):
    its default comes from the environment variable the workers read too."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        return bool(config.layout_optimization)
    default = "0" if torch.version.hip else "1"  # as Inductor's config.py sets it
    return os.environ.get("TORCHINDUCTOR_LAYOUT_OPTIMIZATION", default) == "1"


def channels_last_twin(
    base: Settings, results: list[TrialResult], space: SearchSpace, device: torch.device
) -> Settings | None:
    """The settings to compile in place of contiguous `base`, or None: its channels_last twin,
    where Inductor runs every conv in channels_last anyway (`inductor_convs_channels_last`).
    Compiled from contiguous weights, the graph is the same but for a conversion of every conv
    weight (and its gradient) at each step, so the channels_last twin runs as fast or faster,
    and compiling both would pay a second cold compile for a candidate that cannot win. Only
    where the space lists channels_last and the eager twin ran in the search (accepted, or raced
    out as slower; not failed or rejected)."""
    if base.memory_format != "contiguous" or not inductor_convs_channels_last(device):
        return None
    if "channels_last" not in space.knobs.get("memory_format", []):
        return None
    twin = base.model_copy(update={"memory_format": "channels_last"})
    ran = any(r.settings.global_only().eager() == twin and r.status in ("ok", "stopped")
              for r in results)  # fmt: skip
    return twin if ran else None


def _twin_why(twin: Settings) -> str:
    return (
        f"compiled as {twin.model_copy(update={'compile': 'default'}).label()} instead: on "
        "this CPU Inductor runs every conv in channels_last whatever the model's layout, and "
        "from contiguous weights it adds their conversion at every step (as fast or slower in "
        "every model tried)"
    )


def _out_of_reach(
    base: TrialResult, best: tuple[TrialResult, ...], contest: Contest
) -> str | None:
    """Why compiling `base` could not change the answer, or None: its eager time, beyond its
    interval, is slower than the best eager candidate's by more than the most a compile is
    assumed to speed up its eager twin (`Contest.compile_out_of_reach`)."""
    measured = [r.measurement for r in best if r.measurement is not None]
    if base.measurement is None or not measured:
        return None
    leader = min(measured, key=lambda m: m.ci_high_ms)
    if not contest.compile_out_of_reach(base.measurement, leader):
        return None
    return (
        f"its eager time ({base.measurement.median_ms:.3g} ms) is "
        f"{base.measurement.median_ms / leader.median_ms:.2f}x the best eager candidate's "
        f"({leader.median_ms:.3g} ms): its compile could not win unless it were more than "
        f"{contest.compile_max_gain:g}x faster than eager (the space's compile_max_gain)"
    )


def compile_race(outcome: SearchOutcome, contest: Contest) -> Race | None:
    """The race a compiled candidate runs: against the fastest accepted eager candidate, as in
    the search. One that provably cannot beat it stops after its first samples, before the
    dearest part of its trial (the gate's capture, which compiles again on a model with
    dropout). One that could beat it is then timed beside that eager candidate, its bill's
    alternative, and stops there when its cold compile cannot pay back within the horizon
    (`advisor.execute.payback`)."""
    ok = [r for r in outcome.results if r.status == "ok" and r.measurement is not None
          and not r.settings.compiled]  # fmt: skip
    leader = min(ok, key=lambda r: r.median_ms, default=None)
    if leader is None:
        return None
    return contest.race(leader.measurement, rival=leader.settings.model_dump_json(), pays=True)

