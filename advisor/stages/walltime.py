"""Where a run's wall time goes: each stage's span, kept as it ends and shown as it ends.

The spans are wall time in the run's own process, so a stage's figure includes everything done
for it elsewhere (an isolated worker's trials, a fresh process's check). Some figures are parts
of a stage rather than stages (`PARTS`), read from the trials' own records: the precision checks
(training runs, inside the global knobs' trials), the gate's checks, an eager candidate's first
calls, Triton's autotuning, cuDNN's searches and warm-ups, Inductor's start (its imports and the C++ compiler's
checks, once per process, paid by the compile stage's first trial), the cold compiles (first
calls with empty caches) and the gate's compiles; and the start-up work a stage paid late
(`DEFERRED_LOAD`, `PROCESS_STARTS`). Each stage's timed samples are a part of it too (`TIMED`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from advisor import impls
from advisor.config import FinalCheck
from advisor.execute.profiling import process_age_s  # the command's own start-up (cli)
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement

__all__ = ["GATE", "LOAD", "PROCESS_STARTS", "STAGES", "TIMED", "StageClock", "breakdown",
           "breakdown_line", "gate_s", "harness_share", "process_age_s", "stage_of", "timed_by_stage"]

LOAD = "start-up and load"
TIMED = "timed samples"  # not a stage: the seconds inside the candidates' samples
STAGES = (LOAD, "global knobs", "per-layer", "compile", "re-time", "final check")
# The gate's cost is counted apart from the harness's, as the cold compiles are: the numeric
# verdict is measured work (what the advice stands on), the harness only surrounds the samples.
GATE = "output and layer checks"
# An eager candidate's harness, from its trial's own record: its first call (a new layout or
# dtype loads kernels and builds plans), cuDNN's search where cudnn.benchmark is on (the first
# call of a twin, in a fresh process) and its warm-up.
SEARCHES = "cuDNN's searches"
FIRST_CALLS = "first calls"
WARM_UPS = "warm-ups"
AUTOTUNING = "autotuning"  # a layer implementation's first call that autotunes (Triton)
PARTS = {"global knobs": ("precision checks", GATE, AUTOTUNING, SEARCHES, FIRST_CALLS, WARM_UPS),
         "per-layer": (GATE, AUTOTUNING, SEARCHES, FIRST_CALLS, WARM_UPS),
         "compile": ("Inductor start", "cold compiles", "gate's compiles")}  # fmt: skip
# A model file the probe loaded is loaded in the advise process only when a stage needs it
# (advisor.workload.deferred): that stage's part, since it is start-up work paid late.
DEFERRED_LOAD = "the model's load in this process"
# What a stage waited for a process to start in: an interpreter, torch's import, the model's
# load and the device's context (cudnn.benchmark's worker, a replaced worker, the final check's).
PROCESS_STARTS = "process starts"


@dataclass
class StageClock:
    """Wall time per stage since `start` (a `time.perf_counter()` value); `report(stage, s, all_s)`
    is called as each span ends, with the stage's seconds so far (the console prints a line)."""

    start: float
    report: Callable[[str, float, float], None] | None = None
    spans: dict[str, float] = field(default_factory=dict)
    paid: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> part -> s
    _current: str | None = None

    def _add(self, name: str, seconds: float, ended: bool = True) -> None:
        self.spans[name] = self.spans.get(name, 0.0) + seconds
        if self.report is not None and ended:
            self.report(name, seconds, self.spans[name])

    def until_now(self, name: str) -> None:
        """`name` took the time since the start (the first span: start-up and load)."""
        self._add(name, time.perf_counter() - self.start)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        ended = False
        outer, self._current = self._current, name
        try:
            yield
            ended = True
        finally:
            self._current = outer
            # A stage that raised is not shown as done: its error is the run's one line.
            self._add(name, time.perf_counter() - began, ended)

    def pay(self, part: str, seconds: float) -> None:
        """`seconds` of start-up work (`DEFERRED_LOAD`, `PROCESS_STARTS`) paid during the current
        stage (outside any stage: counted with the start-up)."""
        here = self.paid.setdefault(self._current or LOAD, {})
        here[part] = here.get(part, 0.0) + seconds

    def deferred_load(self, seconds: float) -> None:
        """The model was loaded in this process, taking `seconds`."""
        self.pay(DEFERRED_LOAD, seconds)

    def process_start(self, seconds: float) -> None:
        """A stage waited `seconds` for a process to start."""
        self.pay(PROCESS_STARTS, seconds)


def breakdown(
    spans: dict[str, float],
    results: Sequence[TrialResult],
    total_s: float,
    paid: dict[str, dict[str, float]] | None = None,
    layers: Sequence[TrialResult] = (),
    final: Sequence[FinalCheck] = (),
) -> dict[str, float]:
    """Seconds by stage in pipeline order, with the parts (`"global knobs: precision checks"`,
    `"compile: Inductor start"`, `"compile: cold compiles"`, the start-up work a stage paid:
    `paid`, `StageClock.paid`), the rest of the run (`"other"`: writing,
    tables) and `"total"`. `layers`: the layer measurements the per-layer stage took in this run
    (its samples, first calls, warm-ups and checks are that stage's); `final`: the final checks
    it made (their rounds are the final check's samples). A part is never shown as
    more than its stage: a result reused from an earlier run carries that run's figures."""
    checks: dict[str, float] = {}
    for r in results:  # a verdict judged before this run cost it nothing
        if r.precision_check is not None and not r.precision_check.reused:
            checks[r.precision_check.own_path.model_dump_json()] = r.precision_check.seconds
    compiled = [r for r in results if r.settings.compiled]
    gated = {  # the gate's checks by the stage a candidate belongs to (compiled: not split)
        stage: sum(r.gate_s or 0.0 for r in results if stage_of(r) == stage)
        for stage in ("global knobs", "per-layer")
    }
    parts = {
        "precision checks": sum(checks.values()),
        "Inductor start": sum(r.compile_start_s or 0.0 for r in compiled),
        "cold compiles": sum(r.compile_cold_s or 0.0 for r in compiled),
        # a compiled candidate's numeric check under the gate's dropout masks compiles another
        # graph with empty caches: cold too, but the check's cost, not the user's
        "gate's compiles": sum(r.compile_check_s or 0.0 for r in compiled),
    }
    timed = timed_by_stage(results)
    eager = _eager_parts(results)
    if layers:  # a layer's own trial: its figures are the per-layer stage's, whatever it swaps
        timed["per-layer"] = timed.get("per-layer", 0.0) + sum(timed_by_stage(layers).values())
        mine = eager.setdefault("per-layer", {})
        for spent in _eager_parts(layers).values():
            for k, v in spent.items():
                mine[k] = mine.get(k, 0.0) + v
        gated["per-layer"] += sum(r.gate_s or 0.0 for r in layers)
    if final:
        timed["final check"] = sum(sum(ms) * reps for c in final for reps, ms in c.measured) / 1e3
    out: dict[str, float] = {}
    for name in STAGES:
        if name not in spans:
            continue
        out[name] = round(spans[name], 3)
        left = spans[name]
        here = {**parts, GATE: gated.get(name, 0.0), **eager.get(name, {}),
                **(paid or {}).get(name, {})}  # fmt: skip
        for part in (*PARTS.get(name, ()), DEFERRED_LOAD, PROCESS_STARTS):
            seconds = here.get(part, 0.0)
            if seconds > 0:
                out[f"{name}: {part}"] = round(min(seconds, left), 3)
                left -= out[f"{name}: {part}"]
        if name in timed and name != LOAD:  # the samples inside it, also a part of it
            out[f"{name}: {TIMED}"] = round(min(timed[name], left), 3)
    out["other"] = round(max(0.0, total_s - sum(spans.values())), 3)
    out["total"] = round(total_s, 3)
    out[TIMED] = round(min(sum(timed.values()), total_s), 3)
    return out


def _phases(r: TrialResult) -> tuple[list[Measurement], list[Measurement]]:
    """A candidate's measurements in its trial (one per shape; its screen; its payback rounds)
    and in its re-times (a re-timed candidate's `replaced` starts with its trial's)."""
    taken = r.per_shape or ([r.measurement] if r.measurement is not None else [])
    history = [*r.replaced, *taken]
    n = len(taken) if r.retimed else len(history)
    return [*history[:n], *([r.screen] if r.screen else []), *(r.payback or [])], history[n:]


def _eager_parts(results: Sequence[TrialResult]) -> dict[str, dict[str, float]]:
    """Seconds of first calls (cuDNN's searches apart) and warm-ups by eager stage, from the
    trials' own records (a compiled candidate's first call is its cold compile, a part of the
    compile stage)."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if r.settings.compiled:
            continue
        here = out.setdefault(stage_of(r), {})
        first = (AUTOTUNING if impls.get_impl(r.settings.conv_impl).autotunes
                 else SEARCHES if r.settings.cudnn_benchmark else FIRST_CALLS)  # fmt: skip
        screened = r.screen.first_call_ms if r.screen is not None else None
        taken = _phases(r)[0]
        if not taken and r.stop is not None and r.stop.cold_s:  # stopped in its first call
            here[first] = here.get(first, 0.0) + r.stop.cold_s  # (its allowance, the budget)
        for m in taken:
            # a survivor resumed on its screen's built candidate reports the screen's first
            # call again (`timing.measure(resume=)`): paid once
            again = m is not r.screen and screened is not None and m.first_call_ms == screened
            here[first] = here.get(first, 0.0) + (0.0 if again else (m.first_call_ms or 0.0) / 1e3)
            here[WARM_UPS] = here.get(WARM_UPS, 0.0) + (m.warmup_s or 0.0)
    return out


def stage_of(r: TrialResult) -> str:
    """The stage that measured a candidate: compile, per-layer (layer swaps) or global knobs."""
    if r.settings.compiled:
        return "compile"
    return "per-layer" if r.settings.layers else "global knobs"


def timed_by_stage(results: Sequence[TrialResult]) -> dict[str, float]:
    """Seconds inside the candidates' timed samples (each sample is `reps` calls), by the stage
    that took them: a candidate's trial (its screen, its payback rounds) in its own stage
    (`stage_of`), its re-times' (and the trial's samples they replaced) in the re-time."""
    out: dict[str, float] = {}
    for r in results:
        trial, retimes = _phases(r)
        for stage, ms in ((stage_of(r), trial), ("re-time", retimes)):
            if ms:
                out[stage] = out.get(stage, 0.0) + sum(sum(m.samples_ms) * m.reps for m in ms) / 1e3
    return out


GATE_PARTS = ("precision checks", GATE, "gate's compiles")


def gate_s(stage_s: dict[str, float]) -> float:
    """Seconds in the numeric gate's checks: training checks, captures and layer checks, the
    compiles its captures under dropout masks need."""
    return sum(v for k, v in stage_s.items() if ": " in k and k.split(": ", 1)[1] in GATE_PARTS)


def harness_share(stage_s: dict[str, float], gate_apart: bool = False) -> float | None:
    """The share of the run's wall time outside the candidates' timed samples; `gate_apart`:
    outside the samples and the gate's checks, over the run less those checks."""
    total = stage_s.get("total")
    if not total or TIMED not in stage_s:
        return None
    if gate_apart:
        total -= gate_s(stage_s)
        if total <= 0:
            return None
    return min(1.0, max(0.0, 1.0 - stage_s[TIMED] / total))


def breakdown_line(stage_s: dict[str, float]) -> str:
    """'start-up and load 3.1 s, global knobs 12.0 s (precision checks 5.2 s), compile 30.0 s
    (Inductor start 5.1 s, cold compiles 20.3 s), ...; total 61.4 s'."""
    items = []
    for name, seconds in stage_s.items():
        if ": " in name or name in ("total", TIMED):
            continue
        parts = [f"{k.split(': ', 1)[1]} {v:.1f} s" for k, v in stage_s.items()
                 if k.startswith(f"{name}: ") and v >= 0.05]  # 0.0 s says nothing  # fmt: skip
        items.append(f"{name} {seconds:.1f} s" + (f" ({', '.join(parts)})" if parts else ""))
    line = ", ".join(items) + f"; total {stage_s.get('total', 0.0):.1f} s"
    share = harness_share(stage_s)
    if share is not None:
        line += f", {stage_s[TIMED]:.1f} s of it in timed samples (harness {share:.0%}"
        apart = harness_share(stage_s, gate_apart=True)
        if gate_s(stage_s) > 0 and apart is not None:
            line += f"; {apart:.0%} with the gate's checks counted apart"
        line += ")"
    return line
