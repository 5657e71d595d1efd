"""What the user sees while tuning and at the end: a progress bar and the answer as tables (stderr)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from advisor.stages.walltime import breakdown_line

if TYPE_CHECKING:
    from advisor.advice import Advice
    from advisor.measure.results import TrialResult
    from advisor.search.options import Progress as SearchProgress


def _stderr_console() -> Console:
    console = Console(stderr=True)
    if not console.is_terminal:  # logs and pipes: don't wrap tables at 80 columns
        console = Console(stderr=True, width=160)
    return console


class ProgressReporter:
    """A rich progress bar on stderr: trial n of N, best so far, time left."""

    def __init__(self, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or _stderr_console()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressReporter:
        if self.enabled:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("best {task.fields[best]}"),
                TextColumn("{task.fields[last]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is None:
            return
        if self._bar.tasks:
            self._bar.__exit__(None, None, None)
            return
        # Nothing was drawn (bad input found before the search): the bar's own stop would end
        # its empty display with a newline off a terminal, a blank line before the error's one.
        self._bar.live.stop()

    def update(self, p: SearchProgress) -> None:
        if p.ended_s is not None:
            # A line as each span of a stage ends, a resumed one's with the stage's time in all
            # (the pick's gate after the re-time): shown in a log or a pipe too, without a bar.
            more = f" more, {p.elapsed_s:.1f} s in all" if p.elapsed_s > p.ended_s else ""
            if self.enabled:
                self.console.print(f"{p.stage}: done in {p.ended_s:.1f} s{more}", highlight=False)
            return
        if self._bar is None:
            return
        best = f"{p.best_ms:.3f} ms" if p.best_ms is not None else "-"
        last = ""
        if p.last is not None:
            last = f"{p.last.settings.label()}: " + (
                f"{p.last.median_ms:.3f} ms" if p.last.status == "ok" else p.last.status
            )
        if self._task is None or self._bar.tasks[self._task].description != p.stage:
            self._task = self._bar.add_task(p.stage, total=p.total, best=best, last=last)
        self._bar.update(self._task, completed=p.done, total=p.total, best=best, last=last[:60])

    def summary(self, advice: Advice, out: Path | None = None) -> None:
        for table in summary_tables(advice):
            self.console.print(table)
        r = advice.config.result
        if r is not None:
            self.console.print(f"[bold]Why:[/bold] {r.why}")
            if r.benchmark_note:
                self.console.print(f"[bold]cudnn.benchmark:[/bold] {r.benchmark_note}")
            for line in r.precisions:
                self.console.print(f"[bold]Precision:[/bold] {line}")
            if r.compile_note:
                self.console.print(f"[bold]torch.compile:[/bold] {r.compile_note}")
            if r.final_check is not None:
                self.console.print(f"[bold]Final check:[/bold] {r.final_check.summary()}")
            for w in r.warnings:
                self.console.print(f"[bold yellow]Warning:[/bold yellow] {w}")
            for note in r.notes:
                self.console.print(f"[bold]Note:[/bold] {note}")
            if r.stage_s:
                self.console.print(f"[bold]Time:[/bold] {breakdown_line(r.stage_s)} "
                                   f"({r.effort} effort)")  # fmt: skip
            if r.payback:
                self.console.print(f"[bold]Worth it:[/bold] {r.payback}")
        if out is not None:
            self.console.print(f"Wrote {out} (apply with advisor.apply({str(out)!r}, model))")

    def eager(self, advice: Advice, out: Path) -> None:
        """The eager answer, written before the compile stage starts: one line."""
        r = advice.config.result
        if r is None:
            return
        label = advice.settings.label()
        held = ""
        if r.final_check is not None:
            held = "; it held in the final check" if r.final_check.held else ""
        self.console.print(
            f"[bold]Eager answer:[/bold] {label}, {r.speedup:.2f}x "
            f"[{r.speedup_ci[0]:.2f}, {r.speedup_ci[1]:.2f}] the default's speed{held}; wrote "
            f"{out}. The compile stage now tries torch.compile on it (Ctrl-C keeps this answer)"
        )


def _ms(m: float | None) -> str:
    return "-" if m is None or math.isnan(m) or math.isinf(m) else f"{m:.3f}"


_KINDS = {"raced": "slower (raced out)", "screened": "screened out", "budget": "time budget",
          "out_of_time": "time budget", "cannot_pay": "compile cannot pay back",
          "oom": "out of memory", "device": "device error", "crash": "crashed",
          "timeout": "timed out", "start": "worker did not start",
          "not_finite": "NaN/Inf in results", "tolerance": "error too high",
          "precision": "precision not accepted", "memory": "over the memory limit"}
_UNKNOWN = {"stopped": "stopped early", "failed": "raised an error"}


def kind_words(status: str, kind: str = "") -> str:
    """A stopped, rejected or failed candidate's kind (`TrialResult.kind`), in a few words a
    reader can scan; its reason's text is never read."""
    if status in ("ok", "not gated"):
        return ""
    return _KINDS.get(kind, _UNKNOWN.get(status, status))


def kind_beside(status: str, kind: str = "") -> str:
    """`kind_words` for a column beside the status: empty where it would repeat it."""
    words = kind_words(status, kind)
    return "" if words == status else words


def status_text(status: str, kind: str = "") -> str:
    """A candidate's status and what kind of failure or stop it was, each word once: "ok",
    "stopped: slower (raced out)", "rejected: error too high", "rejected" (not "rejected:
    rejected")."""
    words = kind_words(status, kind)
    if not words or words == status:
        return status
    return words if words.split()[0] == status else f"{status}: {words}"


def _speedup_text(base: TrialResult, x: TrialResult) -> str:
    """Ratio to the default with the interval the pick uses; '-' without a timing."""
    from advisor.search.pick import speedup_over

    if base.measurement is None or x.measurement is None:
        return "-"
    ratio, lo, hi = speedup_over(base, x)
    return f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}]"


def summary_tables(advice: Advice) -> list[Table]:
    """Baseline vs recommended, single changes, rejections, per-layer choices, not searched."""
    tables = [_headline_table(advice)]
    singles = [x for x in advice.results if len(x.settings.changes()) == 1]
    if singles:
        tables.append(_singles_table(advice.baseline, singles))
    bad = [x for x in advice.results if x.status not in ("ok", "stopped")]
    if bad:
        tables.append(_bad_table(bad))
    r = advice.config.result
    if r is not None and r.rejected_faster:
        t = Table(title="Faster than the recommendation, rejected by the numeric gate")
        t.add_column("candidate, its error, and what would accept it")
        for line in r.rejected_faster:
            t.add_row(line)
        tables.append(t)
    if advice.settings.layers:
        t = Table(title="Per-layer implementations")
        t.add_column("layer")
        t.add_column("implementation")
        for name, impl in advice.settings.layers.items():
            t.add_row(name, impl)
        tables.append(t)
    dropped = getattr(advice.outcome, "dropped", None)
    if dropped:
        t = Table(title="Not searched on this machine")
        t.add_column("knob value or combination")
        t.add_column("why")
        for d in dropped:
            t.add_row(d.what, d.reason)
        tables.append(t)
    return tables


def _headline_table(advice: Advice) -> Table:
    r = advice.config.result
    base, best = advice.baseline, advice.best
    t = Table(title=f"{advice.config.workload.get('description', '')} ({advice.config.mode})")
    t.add_column("")
    t.add_column("settings")
    t.add_column("median ms", justify="right")
    t.add_column("95% CI ms", justify="right")
    t.add_column("speedup [95% CI]", justify="right")
    t.add_column("rel. error", justify="right")
    for name, res in (("PyTorch default", base), ("recommended", best)):
        m = res.measurement
        assert m is not None
        speed = "1.00x"
        if res is best and r is not None:
            speed = f"{r.speedup:.2f}x [{r.speedup_ci[0]:.2f}, {r.speedup_ci[1]:.2f}]"
        t.add_row(
            name,
            res.settings.label(),
            _ms(m.median_ms),
            f"{_ms(m.ci_low_ms)}–{_ms(m.ci_high_ms)}",
            speed,
            f"{res.rel_error or 0:.1e}",
        )
    return t


def _singles_table(base: TrialResult, singles: list[TrialResult]) -> Table:
    t = Table(title="Each single change from the default, on its own")
    t.add_column("change")
    t.add_column("median ms", justify="right")
    t.add_column("vs default [95% CI]", justify="right")
    t.add_column("status")
    for x in sorted(singles, key=lambda x: x.median_ms):
        status = status_text(x.shown_status, x.kind)
        t.add_row(x.settings.label(), _ms(x.median_ms), _speedup_text(base, x), status)
    return t


def _bad_table(bad: list[TrialResult]) -> Table:
    t = Table(title="Rejected or failed candidates")
    for col in ("settings", "status", "kind", "why", "median ms"):
        t.add_column(col, justify="right" if col == "median ms" else "left")
    for x in bad:
        t.add_row(
            x.settings.label(),
            x.status,
            kind_beside(x.status, x.kind),
            x.reason or "",
            _ms(x.median_ms),
        )
    return t
