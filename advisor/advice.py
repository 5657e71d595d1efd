"""What `advise` returns (`Advice`): the recommendation (a Config), every measured candidate, and
its exports; `build_advice` makes it from a search's outcome and the stages' results."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.config import Config, FinalCheck, Result, Timing, atomic_write_all, output_paths
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.verdict import own_path, path_name
from advisor.search.compile_bill import benchmark_note, benchmark_search_s, compile_note
from advisor.search.options import SearchOutcome
from advisor.search.pick import Kept, Pick, decide, speedup_over
from advisor.stages.confirm import after_check, first_step_note, runner_held
from advisor.stages.per_layer import LayerChoice
from advisor.version import __version__
from advisor.workload.info import WorkloadInfo

if TYPE_CHECKING:
    import pandas as pd

    from advisor.search.ledger import Stage


def timing_of(m: Measurement) -> Timing:
    return Timing(
        median_ms=m.median_ms,
        ci_low_ms=m.ci_low_ms,
        ci_high_ms=m.ci_high_ms,
        iqr_ms=m.iqr_ms,
        samples=len(m.samples_ms),
    )


class Advice:
    """The recommendation and the evidence behind it.

    `settings` are the tuned settings, `config` the file contents, `trials` a DataFrame of every
    candidate, `save(path)` writes the config (JSON) and the trials table (CSV) beside it.
    """

    def __init__(
        self,
        outcome: SearchOutcome,
        config: Config,
        pick: Pick,
        layer_choices: list[LayerChoice] | None = None,
        stages_done: bool = True,
    ) -> None:
        self.outcome = outcome
        self.config = config
        self.pick = pick
        self.layer_choices = layer_choices or []
        self.stages_done = stages_done  # False: the budget cut a stage short

    @property
    def settings(self):  # noqa: ANN201 - Settings; kept light for readers
        return self.config.settings

    @property
    def results(self) -> list[TrialResult]:
        return self.outcome.results

    @property
    def baseline(self) -> TrialResult:
        return self.outcome.baseline

    @property
    def best(self) -> TrialResult:
        return self.pick.chosen

    @property
    def speedup(self) -> float:
        return self.config.result.speedup if self.config.result else 1.0

    @property
    def trials(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self._trial_rows())

    @property
    def layer_trials(self) -> pd.DataFrame:
        """Per-layer measurements: one row per (layer group, implementation)."""
        import pandas as pd

        return pd.DataFrame(self._layer_rows())

    def _trial_rows(self) -> list[dict[str, Any]]:
        pareto = self.outcome.pareto  # time,memory mode: the Pareto set (else empty)
        chosen = self.pick.chosen.settings
        decided = self.pick.text()  # the pick's row says why, and how it got there
        return [
            {**trial_row(o, r, self.baseline), "pareto": any(r is p for p in pareto),
             "picked": decided if r.settings == chosen else ""}
            for o, r in zip(self.outcome.trial_origins, self.results, strict=True)
        ]  # fmt: skip

    def _layer_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for c in self.layer_choices:
            group = {"layers": ",".join(c.group.names), "layer": c.group.description}
            if not c.results:  # a layer the stage could not take: it keeps PyTorch's forward
                rows.append({**group, "impl": "native", "status": "kept", "reason": c.why,
                             "chosen": True})  # fmt: skip
            for impl, r in c.results.items():
                row = trial_row((-1, "per-layer"), r, c.results["native"])
                rows.append({**row, **group, "impl": impl, "chosen": impl == c.chosen})
            for impl, why in c.skipped.items():
                rows.append({**group, "impl": impl, "status": "not applicable", "reason": why,
                             "chosen": False})  # fmt: skip
        return rows

    def save(self, path: str | Path) -> Path:
        """Write the config, and its trials (and per-layer) CSV beside it, all or none: every file
        is made in full first, then all are renamed into place. An OutputError (an OSError) names
        the file that could not be written; files that were there are left as they were."""
        path = Path(path)
        config, trials, layers = output_paths(path)
        files = {
            config: self.config.model_dump_json(indent=2) + "\n",
            trials: csv_text(self._trial_rows()),
        }
        if self.layer_choices:
            files[layers] = csv_text(self._layer_rows())
        atomic_write_all(files)
        return path

    def __repr__(self) -> str:
        return f"Advice({self.settings.label()}, {self.speedup:.2f}x vs default)"


def csv_text(rows: list[dict[str, Any]]) -> str:
    """`rows` as CSV that pandas reads back as its own `DataFrame(rows).to_csv(index=False)`,
    without its import at the end of a run: columns in the order first seen, None and NaN empty."""
    out = io.StringIO()
    columns = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(out, columns, lineterminator="\n")  # a missing key, None: empty
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        )
    return out.getvalue()


def kept_layers_notes(choices: list[LayerChoice]) -> list[str]:
    """One line per conv layer the per-layer stage could not take: it keeps PyTorch's forward."""
    return [
        f"layer {', '.join(c.group.names)} ({c.group.description}) keeps PyTorch's forward: {c.why}"
        for c in choices
        if c.group.kept is not None  # not a minor group left native at default effort
    ]


def trial_row(origin: tuple[int, Stage], r: TrialResult, baseline: TrialResult) -> dict[str, Any]:
    """One row of the trials table: a candidate's settings, its measurement and speedup over
    `baseline`, its verdict and its costs (`origin`: its trial number, -1 for a later stage's,
    and the stage that measured it, as the ledger holds them)."""
    number, stage = origin
    m = r.measurement
    own = r.replaced[0] if r.replaced else m  # the trial's own phases, before any re-time
    row: dict[str, Any] = {
        "trial": number if number >= 0 else None,
        **r.settings.model_dump(exclude={"layers"}),
    }
    row["layers"] = ";".join(f"{k}={v}" for k, v in r.settings.layers.items())
    row.update(
        label=r.settings.label(),
        status=r.shown_status,
        reason=r.reason or "",
        kind=r.kind,  # why it is out of the pick: its stop's, failure's or rejection's kind
        median_ms=m.median_ms if m else math.nan,
        ci_low_ms=m.ci_low_ms if m else math.nan,
        ci_high_ms=m.ci_high_ms if m else math.nan,
        iqr_ms=m.iqr_ms if m else math.nan,
        samples=len(m.samples_ms) if m else 0,
        first_call_ms=m.first_call_ms if m else math.nan,
        warmup_s=own.warmup_s if own and own.warmup_s is not None else math.nan,
        sampling_s=own.sampling_s if own and own.sampling_s is not None else math.nan,
        compile_cold_s=r.compile_cold_s if r.compile_cold_s is not None else math.nan,
        compile_start_s=r.compile_start_s if r.compile_start_s is not None else math.nan,
        compile_check_s=r.compile_check_s if r.compile_check_s is not None else math.nan,
        speedup=baseline.median_ms / m.median_ms if m else math.nan,
        rel_error=r.rel_error if r.rel_error is not None else math.nan,
        grad_error=r.grad_error if r.grad_error is not None else math.nan,
        precision=r.precision,
        tolerance=r.tolerance,
        grad_tolerance=r.grad_tolerance,
        tolerance_basis=r.tolerance_basis or "",
        layer_error=r.layer_error if r.layer_error is not None else math.nan,
        layer_tolerance=r.layer_tolerance,
        worst_layer=r.layer_detail or "",
        accepted_with=r.rejected_by or "",
        retimed=r.retimed,
        peak_memory_mb=r.peak_memory_mb,
        stage="global knobs" if stage == "search" else stage,
        wall_s=r.wall_s if r.wall_s is not None else math.nan,
        gate_s=r.gate_s if r.gate_s is not None else math.nan,
    )
    return row


def payback(
    tuning_s: float, baseline: TrialResult, chosen: TrialResult, speedup: float,
    search_s: float = 0.0,
) -> str:
    """The tuning's own bill: how many steps of the pick (at `speedup`, the advice's) pay back
    the wall time tuning took, and cuDNN's search at the start of the training run where the
    pick has cudnn.benchmark (`search_s`, `benchmark_search_s`)."""
    saving_ms = baseline.median_ms * (1 - 1 / speedup)
    if chosen.settings == baseline.settings or not saving_ms > 0:
        return f"tuning took {tuning_s:.0f} s and kept PyTorch's default: nothing to pay it back"
    steps = math.ceil((tuning_s + search_s) * 1e3 / saving_ms)
    search = f" and cuDNN's search {search_s:.1f} s at each training start" if search_s else ""
    return (
        f"tuning took {tuning_s:.0f} s{search}; the pick saves {saving_ms:.3g} ms a step: paid "
        f"back after {steps:,} steps"
    )


def rejected_faster(results: list[TrialResult], chosen: TrialResult) -> list[str]:
    """Candidates faster than the pick that the numeric gate rejected, fastest first: what each
    would have given, its error, and the setting that would accept it."""
    out = []
    faster = [
        r
        for r in results
        if r.status == "rejected" and r.measurement is not None and r.median_ms < chosen.median_ms
    ]
    for r in sorted(faster, key=lambda r: r.median_ms):
        ratio = chosen.median_ms / r.median_ms
        line = f"{r.settings.label()} ({ratio:.2f}x the recommendation's speed): {r.reason}"
        if r.rejected_by:
            line += f"; --tolerance {r.rejected_by} would accept it"
        out.append(line)
    return out


def precision_verdicts(results: list[TrialResult]) -> list[str]:
    """How each reduced precision was judged on this model, once each (advisor.gate.precision)."""
    seen: dict[str, str] = {}
    for r in results:
        check = r.precision_check
        if check is not None:
            was = " (judged by an earlier run on this machine, not trained again)"
            seen.setdefault(check.own_path.label(), check.summary + (was if check.reused else ""))
    for r in results:  # a precision none of whose candidates the pick needed judged
        own = own_path(r.settings)
        waited = r.status == "stopped" or r.pending is not None
        if not waited or r.precision in (None, "fp32") or own == Settings():
            continue
        why = (
            "the budget ran out during its training check"
            if r.stop is not None and r.stop.kind == "out_of_time"
            else "no candidate at it could win (slower than the best: its training check is "
            "paid only for one that could be picked)"
        )
        seen.setdefault(
            own.label(), f"{path_name(own, r.precision)}: not judged on this model: {why}"
        )
    return list(seen.values())


def build_advice(
    outcome: SearchOutcome,
    workload_info: WorkloadInfo,
    mode: str,
    space_name: str,
    layer_choices: list[LayerChoice] | None = None,
    retimed: int = 0,
    retime_error: str | None = None,
    notes: list[str] | None = None,
    unsteady: str | None = None,
    *,
    contest: Contest = Contest(),  # noqa: B008 - frozen: one value shared is safe
    final: FinalCheck | None = None,
    final_error: str | None = None,
    other_load: float | None = None,
    stage_s: dict[str, float] | None = None,
    effort: str = "default",
    answer: str = "final",
    stages_done: bool = True,
) -> Advice:
    """The recommendation from the outcome (`pick.decide` under `contest`). PyTorch's default
    stays when the finalists' re-time failed (`retime_error`: never a pick not re-timed against
    the default), when the machine changed under the measurements (`unsteady`, unless the
    caller accepted that), or when the final check where the user runs it did not confirm the
    change (`final`, `final_error`)."""
    min_gain = contest.min_gain
    pick = decide(outcome.results, outcome.baseline, contest)
    eager = pick.eager or pick.chosen
    label = pick.chosen.settings.label()
    keep: tuple[Kept, str] | None = None
    if retime_error is not None:
        keep = ("retime_failed", f"the finalists' interleaved re-time failed ({retime_error}): "
                f"keeping PyTorch's default rather than {label}, which was not re-timed against it")  # fmt: skip
    elif unsteady is not None:
        keep = ("unsteady", f"{unsteady}: keeping PyTorch's default rather than {label} "
                "(--accept-noisy to override)")  # fmt: skip
    elif pick.chosen.pending is not None:  # never recommended ungated
        keep = ("ungated", f"{label} was not gated (its {pick.chosen.pending} not paid before "
                "the run ended): keeping PyTorch's default")  # fmt: skip
    elif final_error is not None:
        keep = ("check_failed", f"the final check of {label} against the default could not be "
                f"made ({final_error}): keeping PyTorch's default")  # fmt: skip
    elif (final is not None and final.challenger is None and not final.held
          and runner_held(final, outcome.results) is None):  # fmt: skip
        lo, hi = final.speedup_ci
        short = (f", a gain under the {min_gain:.0%} a change must bring"
                 if lo > 1.0 and hi < 1 + min_gain else "")  # fmt: skip
        keep = ("did_not_hold", f"{label} did not hold in the final check {final.place} "
                f"({final.figures()}{short}): keeping PyTorch's default")  # fmt: skip
    if keep is not None:
        if pick.chosen is not outcome.baseline:
            kind, why = keep
            pick = Pick(outcome.baseline, pick.fastest, why, (pick.text(),), pick.eager, kind)
    elif final is not None:
        pick = after_check(pick, final, outcome.results)
    chosen, base = pick.chosen, outcome.baseline
    assert chosen.measurement is not None and base.measurement is not None
    if final is not None and chosen is not base:  # the final check decided it: its figure
        runner = final.runner_up_speedup if chosen.settings == final.runner_up else None
        ratio, lo, hi = runner or (final.speedup, *final.speedup_ci)
    else:
        ratio, lo, hi = speedup_over(base, chosen)
    path = list(pick.path) + ([f"after an interleaved re-time of {retimed} finalists"]
                              if retimed else [])  # fmt: skip
    result = Result(
        baseline=timing_of(base.measurement),
        tuned=timing_of(chosen.measurement),
        speedup=ratio,
        speedup_ci=(lo, hi),
        rel_error=chosen.rel_error or 0.0,
        grad_error=chosen.grad_error,
        precision=chosen.precision,
        tolerance=chosen.tolerance or 0.0,
        peak_memory_mb=chosen.peak_memory_mb,
        why=pick.why,
        path=path,
        min_gain=min_gain,
        benchmark_note=benchmark_note(outcome.results, chosen),
        rejected_faster=rejected_faster(outcome.results, chosen),
        precisions=precision_verdicts(outcome.results),
        trials=len(outcome.results),
        rejected=sum(r.status == "rejected" for r in outcome.results),
        failed=sum(r.status == "failed" for r in outcome.results),
        stopped=sum(r.status == "stopped" for r in outcome.results),
        tuning_s=outcome.elapsed_s,
        payback=payback(outcome.elapsed_s, base, chosen, ratio,
                        benchmark_search_s(outcome.results, chosen)),
        notes=(notes or []) + kept_layers_notes(layer_choices or []),
        compile_note=first_step_note(
            compile_note(outcome.results, chosen, eager, contest), chosen, final
        ),
        steps=contest.steps,
        other_load=other_load,
        final_check=final,
        stage_s=stage_s or {},
        effort=effort,
        answer=answer,
    )
    config = Config(
        advisor_version=__version__,
        mode=mode,
        settings=chosen.settings,
        environment=outcome.environment,
        workload={**workload_info.model_dump(mode="json"), "study": outcome.study_name},
        space=space_name,
        result=result,
    )
    return Advice(outcome, config, pick, layer_choices, stages_done)
