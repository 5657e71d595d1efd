"""What a one-off cost buys: break-even steps, and the `--steps` rule. Two settings cost once
per process and save per step: torch.compile (its cold compile) and cudnn.benchmark (cuDNN's
algorithm search, run again for every new shape, dtype and layout).

A compiled candidate's one-off cost is its first call(s) with empty compile caches (cold; every
shape of a shape set compiles), less the eager alternative's own first call; with the caches
filled by an earlier run (warm) it is less. A cudnn.benchmark candidate's is its first call in a
process where no other candidate ran its convolutions with the flag on: what a training run
pays at its start. Each is paid once per key, by the first candidate measured with it
(`paid_by`). Its saving is per step, against the settings the user would run instead
(`alternative`): the eager pick, or the candidate's own twin without the one-off setting where
that is faster (an eager pick can be PyTorch's default only because a noisy round left the
twin's interval touching 1.0x; the user who compiles would still run the twin's settings).
Break-even = cost / saving, in steps. Such a candidate competes only if it pays within the
training steps the user expects (`--steps N`), or within `HORIZON_STEPS` when not told, with a
cold compile or a fresh search (what a first training run pays).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.knobs import Settings
from advisor.measure.contest import HORIZON_STEPS, Contest, break_even
from advisor.measure.results import TrialResult

__all__ = [
    "Bill",
    "benchmark_note",
    "benchmark_search_s",
    "alternative",
    "bill",
    "first_call_s",
    "one_off_s",
    "one_off_text",
    "paid_by",
    "compile_note",
    "horizon_text",
    "paying",
]


@dataclass(frozen=True)
class Bill:
    overhead_s: float  # cold compile or cuDNN's search, over the alternative's first call
    saving_ms: float  # per step, against the eager alternative

    @property
    def steps(self) -> float:
        """Steps until the cold compile is paid back (inf: it never is)."""
        return break_even(self.overhead_s, self.saving_ms)


def first_call_s(r: TrialResult) -> float:
    """`r`'s first call, summed over its shapes."""
    ms = r.per_shape or ([r.measurement] if r.measurement else [])
    return sum(m.first_call_ms or 0.0 for m in ms) / 1e3


def one_off(s: Settings) -> bool:
    """Whether `s` costs something once per training run: a compile or cuDNN's search."""
    return s.compiled or s.cudnn_benchmark


def _conv_key(s: Settings) -> tuple[object, ...]:
    """What cuDNN keys a model's convolution plans by, of these settings: the layout, the
    autocast dtype, whether TF32 convs are allowed and which layers run its own kernels."""
    return (s.memory_format, s.amp, s.tf32 != "off", s.conv_impl, sorted(s.layers.items()),
            s.compile)  # fmt: skip


def _one_off_key(s: Settings) -> tuple[object, ...]:
    """What a one-off cost is paid once for: a compile's graph (`Settings.graph`), or the plan
    keys of cuDNN's search (`_conv_key`)."""
    return ("graph", s.graph().model_dump_json()) if s.compiled else _conv_key(s)


def paid_by(r: TrialResult, results: Sequence[TrialResult]) -> TrialResult:
    """The candidate whose first call paid `r`'s one-off cost: the first measured with the same
    key (`_one_off_key`), `r` itself where it paid its own. cudnn.benchmark twins are measured in
    one process for the flag, the best first (`advisor.stages.benchmark_twins`), so that one's
    first call is a fresh process's, and a later twin with the same plan keys finds its plans
    cached. A compiled candidate whose graph its process had compiled for another (the worker
    reads it warm: `execute.runner`) has no cold compile of its own: the other's is its."""
    if not one_off(r.settings) or (r.settings.compiled and r.compile_cold_s is not None):
        return r
    key = _one_off_key(r.settings)
    for other in results:
        paid = other.compile_cold_s is not None if other.settings.compiled else (
            other.settings.cudnn_benchmark)
        if paid and other.measurement is not None and _one_off_key(other.settings) == key:
            return other
    return r


def one_off_s(r: TrialResult, results: Sequence[TrialResult]) -> float:
    """What `r` costs once per training run: a cold compile, cuDNN's search in a fresh process,
    or just its first call. A compile whose graph was read from a candidate not in `results`
    has no bill here: it never pays (inf)."""
    payer = paid_by(r, results)
    if r.settings.compiled:
        return math.inf if payer.compile_cold_s is None else payer.compile_cold_s
    return first_call_s(payer)


def bill(
    candidate: TrialResult, eager: TrialResult, results: Sequence[TrialResult] = ()
) -> Bill:
    """`candidate`'s cost and saving against the alternative `eager`."""
    base = first_call_s(eager)
    cold = one_off_s(candidate, results) if one_off(candidate.settings) else 0.0
    return Bill(overhead_s=max(0.0, cold - base), saving_ms=eager.median_ms - candidate.median_ms)


def one_off_text(r: TrialResult, b: Bill) -> str:
    """`r`'s one-off cost, named: its compile, or cuDNN's search."""
    if r.settings.compiled:
        return f"its compile ({b.overhead_s:.1f} s with empty caches)"
    return f"cuDNN's search ({b.overhead_s:.1f} s in a fresh process)"


def horizon_text(steps: int | None) -> str:
    """The horizon, as the advice says it: the user's `--steps`, or the default one."""
    if steps is not None:
        return f"the {steps:,} steps it was tuned for"
    return f"the {HORIZON_STEPS:,}-step horizon (--steps to set another)"


def _twin(s: Settings) -> Settings:
    """`s` without its one-off setting: the eager model a compiled one is made from, or the
    same settings without cudnn.benchmark."""
    return s.eager() if s.compiled else s.model_copy(update={"cudnn_benchmark": False})


def alternative(
    candidate: TrialResult, results: Sequence[TrialResult], eager: TrialResult
) -> TrialResult:
    """The settings the user would run instead of `candidate`: the eager pick `eager`, or
    `candidate`'s own twin without its one-off setting (`_twin`) where that was measured faster
    in the same time window (both re-timed together, or neither: a re-time's rounds and a
    trial's samples are taken under different conditions and do not compare)."""
    plain = _twin(candidate.settings)
    twin = next((r for r in results if r.settings == plain
                 and r.status == "ok" and r.measurement is not None
                 and r.retimed == candidate.retimed), None)  # fmt: skip
    return twin if twin is not None and twin.median_ms < eager.median_ms else eager


def paying(
    results: Sequence[TrialResult],
    eager: TrialResult,
    contest: Contest,
    plain: TrialResult | None = None,
) -> tuple[list[TrialResult], list[tuple[TrialResult, Bill]]]:
    """`results` without the candidates with a one-off cost (a compile, cuDNN's search) that do
    not pay within the contest's horizon against their alternative, and those left out with their
    bills. A compile is billed against the eager pick `eager`; cudnn.benchmark against the pick
    without either, `plain` (`eager` when not given)."""
    kept, out = [], []
    for r in results:
        if one_off(r.settings) and r.status == "ok" and r.measurement is not None:
            base = eager if r.settings.compiled or plain is None else plain
            b = bill(r, alternative(r, results, base), results)
            if b.steps > contest.horizon_steps:
                out.append((r, b))
                continue
        kept.append(r)
    return kept, out


def _pays(b: Bill) -> str:
    return f"it pays after about {b.steps:,.0f} steps"


def compile_note(
    results: Sequence[TrialResult],
    chosen: TrialResult,
    eager: TrialResult,
    contest: Contest,
) -> str | None:
    """What the advice says about torch.compile: what the chosen compile costs and when it
    pays; or why none was chosen (slower, failed, or not paying within `steps`)."""
    compiled = [r for r in results if r.settings.compiled]
    if not compiled:
        return None
    ok = [r for r in compiled if r.status == "ok" and r.measurement is not None]
    slower = [r for r in compiled if r.status == "stopped" and r.measurement is not None]
    unpaid = [r for r in compiled if r.stop is not None and r.stop.kind == "cannot_pay"]
    if not ok and unpaid:  # timed beside its rival, it could not pay (execute.payback)
        best = min(unpaid, key=lambda r: r.median_ms)
        why = f"{best.reason}{_breaks(best)}"
        return f"torch.compile ({best.settings.label()}) is not recommended: {why}"
    if not ok and slower:  # raced out after its samples (execute.runner): never gated
        best = min(slower, key=lambda r: r.median_ms)
        alt = alternative(best, results, eager)
        return (
            f"torch.compile ({best.settings.label()}) was slower per step than "
            f"{alt.settings.label()} ({best.median_ms:.3f} vs {alt.median_ms:.3f} ms; its cold "
            f"compile took {one_off_s(best, results):.1f} s{_compiled_by(best, results)}): it "
            f"never pays, and was not checked further{_breaks(best)}"
        )
    if not ok:
        r = compiled[0]
        return f"torch.compile ({r.settings.label()}) was not accepted: {r.reason}{_breaks(r)}"
    best = chosen if chosen.settings.compiled else min(ok, key=lambda r: r.median_ms)
    eager = alternative(best, results, eager)
    b = bill(best, eager, results)
    cost = f"its first call costs {b.overhead_s:.1f} s more with empty caches"
    cost += _compiled_by(best, results)
    if b.saving_ms <= 0:
        return (
            f"torch.compile ({best.settings.label()}) was no faster per step than "
            f"{eager.settings.label()} ({best.median_ms:.3f} vs {eager.median_ms:.3f} ms), and "
            f"{cost}{_breaks(best)}"
        )
    line = (
        f"torch.compile ({best.settings.label()}) saves {b.saving_ms:.3f} ms per step over "
        f"{eager.settings.label()}; {cost}: {_pays(b)}"
    )
    if best is not chosen and b.steps > contest.horizon_steps:
        line += f", more than {horizon_text(contest.steps)}: not recommended"
    elif best is not chosen:
        line += "; not recommended (see why)"
    return line + _breaks(best)


def _compiled_by(r: TrialResult, results: Sequence[TrialResult]) -> str:
    """Where `r`'s cold compile was another candidate's (`paid_by`): which, said."""
    payer = paid_by(r, results)
    if payer is r or not r.settings.compiled:
        return ""
    return f" (measured compiling {payer.settings.label()}: the same graph)"


def _breaks(r: TrialResult) -> str:
    """Where Dynamo broke the compiled model's graph, where it did: often why a compile saves
    little (each break a trip back to Python, each piece compiled and guarded on its own)."""
    if not r.graph_breaks:
        return ""
    n = len(r.graph_breaks)
    places = f"{n} place{'s' if n > 1 else ''}" if n < 20 else "20 places or more"
    return f" (Dynamo broke its graph at {places}; the first: {r.graph_breaks[0]})"


def benchmark_search_s(results: list[TrialResult], chosen: TrialResult) -> float:
    """What cudnn.benchmark's search costs the pick at a training run's start: its first call
    in a process where no candidate had run its convolutions with the flag on
    (`paid_by`), less its twin's without the flag. 0 without the flag."""
    if not chosen.settings.cudnn_benchmark or chosen.settings.compiled:
        return 0.0
    off = chosen.settings.model_copy(update={"cudnn_benchmark": False})
    r_off = next((r for r in results if r.settings == off and r.measurement is not None), None)
    paid = first_call_s(paid_by(chosen, results))
    return max(0.0, paid - (first_call_s(r_off) if r_off is not None else 0.0))


def benchmark_note(results: list[TrialResult], chosen: TrialResult) -> str | None:
    """Whether cudnn.benchmark pays for this pick: its per-step saving against the search a
    training run pays at its start, in a fresh process (`benchmark_search_s`). Said only where
    both twins were measured in the same time window (both re-timed, or neither): a re-timed
    figure set against a search figure can contradict the pick it explains."""
    on = chosen.settings.model_copy(update={"cudnn_benchmark": True})
    off = chosen.settings.model_copy(update={"cudnn_benchmark": False})
    r_on = next((r for r in results if r.settings == on and r.status == "ok"), None)
    r_off = next((r for r in results if r.settings == off and r.status == "ok"), None)
    if r_on is None or r_off is None or r_on.retimed != r_off.retimed:
        return None
    shapes = len(r_on.per_shape or [r_on.measurement])
    cost = benchmark_search_s(results, r_on)
    saving = r_off.median_ms - r_on.median_ms
    search = f"its search costs {cost:.1f} s over {shapes} shape(s) in a fresh process"
    if saving <= 0:
        return (
            f"cudnn.benchmark does not pay here: no faster per step ({r_on.median_ms:.3f} vs "
            f"{r_off.median_ms:.3f} ms) and {search}"
        )
    steps = math.ceil(cost * 1e3 / saving) if cost > 0 else 0
    return (
        f"cudnn.benchmark saves {saving:.3f} ms per step and {search}: it pays after about "
        f"{steps:,} steps"
    )
