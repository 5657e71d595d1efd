"""`advisor report`: a self-contained HTML report (and PNG plots beside it) of one tuning run.

The source is a config file (its study is looked up in the storage; when the study is gone, the
trials CSV beside the config stands in) or a study name. Everything is loaded into a `ReportData`
first, then rendered: plots are made in memory and the files are written last, each atomically,
so a failure never leaves a half-written report.

The HTML needs no network: optuna's plotly figures carry plotly.js inline, matplotlib plots are
embedded as base64 PNGs. matplotlib also writes every plot as a PNG file (`<out>_files/*.png`).
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.config import Config, atomic_write, load_config
from advisor.errors import AdvisorError, ConfigError, StorageError
from advisor.importance import EXACT, Importance, knob_importance
from advisor.progress import failure_kind

if TYPE_CHECKING:
    import argparse

    import optuna
    import pandas as pd
    from matplotlib.figure import Figure

    from advisor.results import TrialResult

STATUS_COLORS = {"ok": "#2a7ab0", "rejected": "#e08a1e", "failed": "#c0392b"}
REQUIRED_CSV_COLUMNS = ("label", "status", "median_ms", "ci_low_ms", "ci_high_ms")


@dataclass
class Summary:
    """Baseline vs recommended: what the config's `result` holds, or what a study implies."""

    baseline_label: str
    tuned_label: str
    baseline: tuple[float, float, float]  # median, CI low, CI high (ms)
    tuned: tuple[float, float, float]
    speedup: float
    speedup_ci: tuple[float, float]
    rel_error: float | None
    precision: str
    tolerance: float | None
    why: str
    trials: int
    rejected: int
    failed: int


@dataclass
class ReportData:
    title: str
    mode: str
    source: str
    environment: dict[str, Any]
    trials: pd.DataFrame
    summary: Summary | None
    config: Config | None = None
    study: optuna.Study | None = None
    layer_rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- loading


def _sqlite_missing(url: str) -> bool:
    """Opening a SQLite URL creates the file: a report must not, so check first."""
    if not url.startswith("sqlite:///"):
        return False
    return not Path(url.removeprefix("sqlite:///")).expanduser().is_file()


def _open_study(name: str, storage_url: str | None) -> optuna.Study | None:
    """The stored study called `name` (or `name@<fingerprint>` when only one matches); None if
    the storage has no such study. A storage that cannot be opened is a StorageError."""
    import optuna

    from advisor.storage import default_storage_url, open_storage

    url = storage_url or default_storage_url()
    if url == "memory":
        raise StorageError("--storage memory holds no studies between runs: name a stored one")
    if _sqlite_missing(url) or ("://" not in url and not Path(url).is_file()):
        return None
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(url)
    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except Exception as e:  # noqa: BLE001 - backends raise many kinds on a corrupt store
        raise StorageError(f"cannot read studies from {url}: {str(e).splitlines()[0]}") from None
    if name not in names:
        matches = [n for n in names if n.startswith(f"{name}@") and not n.endswith("/layers")]
        if len(matches) != 1:
            return None
        name = matches[0]
    return optuna.load_study(study_name=name, storage=storage)


def _layers_study(study: optuna.Study) -> optuna.Study | None:
    """The companion study of per-layer measurements ("<study>/layers"), if the search made one."""
    import optuna

    try:
        return optuna.load_study(study_name=f"{study.study_name}/layers", storage=study._storage)
    except KeyError:
        return None


def _results(study: optuna.Study) -> list[tuple[int, TrialResult]]:
    """Every measured candidate: the study's trials, then the whole-model measurements of
    per-layer combinations kept in the companion study (numbered -1: not trials of this study)."""
    from advisor.results import TrialResult

    out = [
        (t.number, TrialResult.model_validate(t.user_attrs["result"]))
        for t in study.get_trials(deepcopy=False)
        if "result" in t.user_attrs
    ]
    layers = _layers_study(study)
    if layers is not None:
        out += [
            (-1, TrialResult.model_validate(t.user_attrs["result"]))
            for t in layers.get_trials(deepcopy=False)
            if t.user_attrs.get("kind") == "model" and "result" in t.user_attrs
        ]
    return out


def _baseline_of(results: Sequence[TrialResult]) -> TrialResult:
    """PyTorch's default if it was measured (the search enqueues it first), else the first."""
    from advisor.knobs import Settings

    default = Settings()
    for r in results:
        if r.settings == default:
            return r
    return results[0]


def _trials_from_study(study: optuna.Study) -> tuple[pd.DataFrame, list[TrialResult]]:
    import pandas as pd

    from advisor.advice import trial_row

    numbered = _results(study)
    if not numbered:
        raise StorageError(f"study {study.study_name!r} has no measured trials yet")
    results = [r for _, r in numbered]
    baseline = _baseline_of(results)
    df = pd.DataFrame([trial_row(n, r, baseline) for n, r in numbered])
    return df, results


def _summary_from_config(cfg: Config) -> Summary | None:
    r = cfg.result
    if r is None:
        return None
    return Summary(
        baseline_label="default",
        tuned_label=cfg.settings.label(),
        baseline=(r.baseline.median_ms, r.baseline.ci_low_ms, r.baseline.ci_high_ms),
        tuned=(r.tuned.median_ms, r.tuned.ci_low_ms, r.tuned.ci_high_ms),
        speedup=r.speedup,
        speedup_ci=r.speedup_ci,
        rel_error=r.rel_error,
        precision=r.precision,
        tolerance=r.tolerance,
        why=r.why,
        trials=r.trials,
        rejected=r.rejected,
        failed=r.failed,
    )


def _summary_from_results(results: list[TrialResult], min_gain: float = 0.02) -> Summary | None:
    """What the search would have recommended from these trials (same pick rule as `advise`)."""
    from advisor.pick import pick_final
    from advisor.timing import speedup

    base = _baseline_of(results)
    if base.status != "ok" or base.measurement is None:
        return None
    pick = pick_final(results, base, min_gain)
    chosen = pick.chosen
    assert chosen.measurement is not None
    ratio, lo, hi = speedup(base.measurement, chosen.measurement)
    bm, cm = base.measurement, chosen.measurement
    return Summary(
        baseline_label=base.settings.label(),
        tuned_label=chosen.settings.label(),
        baseline=(bm.median_ms, bm.ci_low_ms, bm.ci_high_ms),
        tuned=(cm.median_ms, cm.ci_low_ms, cm.ci_high_ms),
        speedup=ratio,
        speedup_ci=(lo, hi),
        rel_error=chosen.rel_error,
        precision=chosen.precision,
        tolerance=chosen.tolerance,
        why=pick.why,
        trials=len(results),
        rejected=sum(r.status == "rejected" for r in results),
        failed=sum(r.status == "failed" for r in results),
    )


def _trials_from_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=["", "nan", "NaN"])
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ConfigError(f"cannot read trials table {path}: {str(e).splitlines()[0]}") from None
    missing = [c for c in REQUIRED_CSV_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"trials table {path} lacks column(s): {', '.join(missing)}")
    for col in ("reason", "layers"):
        if col in df.columns:
            df[col] = ["" if pd.isna(v) else str(v) for v in df[col]]
    return df


def _trials_from_summary(s: Summary) -> pd.DataFrame:
    """Only the config survives: its two timings are all there is to plot."""
    import pandas as pd

    rows = []
    for i, (label, t) in enumerate(((s.baseline_label, s.baseline), (s.tuned_label, s.tuned))):
        rows.append(
            dict(
                trial=i,
                label=label,
                status="ok",
                reason="",
                median_ms=t[0],
                ci_low_ms=t[1],
                ci_high_ms=t[2],
            )
        )
    return pd.DataFrame(rows).drop_duplicates(subset="label")


def _layer_label(attrs: dict[str, Any]) -> str:
    """'0, 2: Conv3d(4, 4, (1, 3, 3), ...) on 1x4x4x12x12' (older studies: the raw key)."""
    names, desc = attrs.get("names"), attrs.get("description")
    if names and desc:
        return f"{', '.join(names)}: {desc}"
    return str(attrs.get("key", "?"))


def _layer_rows(study: optuna.Study | None, mode: str, env: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-layer measurements from the companion study: one row per layer group and impl."""
    from advisor.results import TrialResult

    layers = _layers_study(study) if study is not None else None
    if layers is None:
        return []
    rows = []
    for t in layers.get_trials(deepcopy=False):
        if "result" not in t.user_attrs or t.user_attrs.get("kind") == "model":
            continue
        r = TrialResult.model_validate(t.user_attrs["result"])
        row: dict[str, Any] = {
            "layer": _layer_label(t.user_attrs),
            "impl": str(t.user_attrs.get("impl", r.settings.conv_impl)),
            # the global settings it ran under: a resume under others measures layers again
            "under": r.settings.global_only().label(),
            "status": r.status,
            "median_ms": r.median_ms if r.measurement else math.nan,
            "reason": r.reason or "",
        }
        spec = t.user_attrs.get("spec")
        if isinstance(spec, dict) and r.measurement is not None:
            row["roofline"] = roofline_fraction_of(spec, mode, r.median_ms, env)
        rows.append(row)
    return rows


def load_report_data(source: str, storage: str | None = None) -> ReportData:
    """A config file (with its study, or its trials CSV) or a study name in `storage`."""
    path = Path(source)
    if path.suffix == ".json" or path.is_file():
        return _from_config(path, storage)
    study = _open_study(source, storage)
    if study is None:
        raise StorageError(
            f"no config file or study named {source!r} (storage: {storage or 'the default cache'})"
        )
    return _from_study(study, source)


def _from_config(path: Path, storage: str | None) -> ReportData:
    cfg = load_config(path)
    env = cfg.environment.model_dump(mode="json")
    title = str(cfg.workload.get("description") or cfg.workload.get("target") or path.name)
    data = ReportData(title, cfg.mode, str(path), env, None, _summary_from_config(cfg), cfg)  # type: ignore[arg-type]
    study_name = cfg.workload.get("study")
    study = None
    if isinstance(study_name, str):
        try:
            study = _open_study(study_name, storage)
        except StorageError as e:
            data.notes.append(f"study not read ({e}): built from the config and its trials table")
    if study is not None:
        data.study = study
        data.trials, _ = _trials_from_study(study)
        data.layer_rows = _layer_rows(study, cfg.mode, env)
        data.notes.append(f"trials from study {study.study_name!r}")
        return data
    csv = path.with_name(path.stem + ".trials.csv")
    if csv.is_file():
        data.trials = _trials_from_csv(csv)
        data.notes.append(f"study not found in the storage: trials from {csv.name}")
    elif data.summary is not None:
        data.trials = _trials_from_summary(data.summary)
        data.notes.append("neither the study nor the trials table found: only the config's result")
    else:
        raise ConfigError(f"{path} has no result, and neither its study nor {csv.name} exists")
    return data


def _from_study(study: optuna.Study, source: str) -> ReportData:
    attrs = study.user_attrs
    workload = attrs.get("workload") or {}
    trials, results = _trials_from_study(study)
    env = attrs.get("environment") or {}
    mode = str(attrs.get("mode", "?"))
    data = ReportData(
        title=str(workload.get("description") or workload.get("target") or study.study_name),
        mode=mode,
        source=f"study {study.study_name!r}",
        environment=env,
        trials=trials,
        summary=_summary_from_results(results),
        study=study,
    )
    data.layer_rows = _layer_rows(study, mode, env)
    if data.summary is None:
        data.notes.append("PyTorch's default has no valid measurement: no speedup to report")
    return data


# ---------------------------------------------------------------- roofline (optional module)


def roofline_fraction_of(
    spec: dict[str, Any], mode: str, median_ms: float, env: dict[str, Any]
) -> float | None:
    """Fraction of the roofline floor a layer reached, when advisor.roofline exists and this is
    the machine it was tuned on (peaks measured elsewhere would be meaningless); else None."""
    try:
        from advisor import roofline  # type: ignore[attr-defined]
    except ImportError:
        return None
    from advisor.environment import current_environment

    try:
        device = str(env.get("device_type", "cpu"))
        if current_environment(device).fingerprint != env.get("fingerprint"):
            return None
        return float(roofline.layer_fraction(spec, mode, median_ms, device))
    except Exception:  # noqa: BLE001 - an optional column: never fail the report for it
        return None


# ---------------------------------------------------------------- plots


def _matplotlib() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window
    import matplotlib.pyplot as plt

    return plt


def time_figure(df: pd.DataFrame, baseline_label: str | None, tuned_label: str | None) -> Figure:
    """Median time per candidate with its 95% CI, colored by status; failed ones marked apart."""
    plt = _matplotlib()
    d = df.copy()
    d["_order"] = d["median_ms"].fillna(math.inf)
    d = d.sort_values("_order", ascending=False, kind="stable").reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, max(2.6, 0.42 * len(d) + 1.4)), layout="constrained")
    timed = d["median_ms"].notna()
    left = float(d.loc[timed, "ci_low_ms"].min()) if timed.any() else 1.0
    for status, color in STATUS_COLORS.items():
        sel = d[(d["status"] == status) & timed]
        if len(sel):
            err = [
                (sel["median_ms"] - sel["ci_low_ms"]).clip(lower=0),
                (sel["ci_high_ms"] - sel["median_ms"]).clip(lower=0),
            ]
            ax.errorbar(
                sel["median_ms"],
                sel.index,
                xerr=err,
                fmt="o",
                color=color,
                ecolor=color,
                capsize=3,
                label=status,
            )
    failed = d[~timed]
    if len(failed):
        ax.scatter(
            [left] * len(failed),
            failed.index,
            marker="x",
            color=STATUS_COLORS["failed"],
            label="failed (no timing)",
        )
    if baseline_label is not None:
        base = d[d["label"] == baseline_label]
        if len(base) and base["median_ms"].notna().any():
            ax.axvline(float(base["median_ms"].iloc[0]), color="grey", ls="--", lw=1)
    ax.set_yticks(list(d.index), [_tick(lbl, lbl == tuned_label) for lbl in d["label"]])
    for tick, lbl in zip(ax.get_yticklabels(), d["label"], strict=True):
        if lbl == tuned_label:
            tick.set_fontweight("bold")
    if timed.any() and d.loc[timed, "ci_high_ms"].max() > 10 * max(left, 1e-9):
        ax.set_xscale("log")
    ax.set_xlabel("time per step (ms): median with 95% CI; dashed line: PyTorch default")
    ax.set_title("Time per candidate")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def _tick(label: str, recommended: bool) -> str:
    short = label if len(label) <= 60 else label[:57] + "..."
    return f"★ {short}" if recommended else short


def _target_kwargs(study: optuna.Study) -> dict[str, Any]:
    """Multi-objective studies (time, memory) plot their first objective: time."""
    if len(study.directions) > 1:
        return {"target": lambda t: t.values[0], "target_name": "median ms"}
    return {"target_name": "median ms"}


def importance_problem(study: optuna.Study) -> str | None:
    """Why knob importance cannot be computed for this study, or None when it can."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2:
        return f"needs at least 2 completed (accepted) trials; this study has {len(done)}"
    params: dict[str, set[str]] = {}
    for t in done:
        for k, v in (t.params or t.system_attrs.get("fixed_params", {})).items():
            params.setdefault(k, set()).add(repr(v))
    if not any(len(v) > 1 for v in params.values()):
        return "no knob took more than one value among the accepted trials"
    return None


def _optuna_plot(make: Callable[[], Any]) -> tuple[Any, str | None]:
    """Call an optuna plot function; (figure, None) or (None, why it could not be drawn)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna's matplotlib backend is "experimental"
            return make(), None
    except (ValueError, RuntimeError, ZeroDivisionError, ImportError) as e:
        return None, (str(e).splitlines() or [type(e).__name__])[0]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _matplotlib().close(fig)
    return buf.getvalue()


@dataclass
class Plots:
    png: dict[str, bytes] = field(default_factory=dict)  # file stem -> PNG bytes
    html: dict[str, str] = field(default_factory=dict)  # section -> plotly div
    notes: dict[str, str] = field(default_factory=dict)  # section -> why there is no plot
    captions: dict[str, str] = field(default_factory=dict)  # section -> text under its plot


def make_plots(data: ReportData) -> Plots:
    plots = Plots()
    s = data.summary
    fig = time_figure(data.trials, s.baseline_label if s else None, s.tuned_label if s else None)
    plots.png["time"] = _png(fig)
    study = data.study
    if study is None:
        why = "needs the optuna study (not found in the storage)"
        plots.notes["history"] = plots.notes["importance"] = why
        return plots
    import optuna.visualization as vis
    import optuna.visualization.matplotlib as vis_mpl

    if not _has_complete(study):
        plots.notes["history"] = "no completed (accepted) trial to plot"
    else:
        title = "Optimisation history: median time of each accepted trial"
        kw = _target_kwargs(study)
        fig, why = _optuna_plot(lambda: vis.plot_optimization_history(study, **kw))
        ax, why_mpl = _optuna_plot(lambda: vis_mpl.plot_optimization_history(study, **kw))
        if fig is None or ax is None:
            plots.notes["history"] = why or why_mpl or "not computable"
        else:
            _add_plotly(plots, "history", fig, title)
            _polish(ax, title, "trial number")
            mpl_fig = ax.figure
            mpl_fig.set_size_inches(8, 4.5)
            mpl_fig.tight_layout()
            plots.png["history"] = _png(mpl_fig)
    problem = importance_problem(study)
    imp, why = (None, problem) if problem else _optuna_plot(lambda: knob_importance(study))
    if imp is None:
        plots.notes["importance"] = why or "not computable"
    else:
        _importance_plots(plots, imp)
    return plots


def _add_plotly(plots: Plots, name: str, fig: Any, title: str) -> None:
    fig.update_layout(title=title, height=380, margin=dict(l=40, r=20, t=50, b=40))
    plots.html[name] = fig.to_html(
        full_html=False,
        include_plotlyjs=not plots.html,  # plotly.js inline, once
        config={"displaylogo": False},
    )


def _polish(ax: Any, title: str, axis: str) -> None:
    """Our words on optuna's axes."""
    from matplotlib.ticker import MaxNLocator

    for loc in ("left", "right"):
        ax.set_title("", loc=loc)
    ax.set_title(title)
    ax.set_xlabel(axis)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def importance_title(imp: Importance) -> str:
    """The title names the method: an exact share and an fANOVA estimate read differently."""
    if imp.method == EXACT:
        return "Knob importance: exact share of variance of log time (complete grid)"
    return "Knob importance: fANOVA estimate (partial search)"


def _importance_plots(plots: Plots, imp: Importance) -> None:
    """Bars of the shares (largest on top), plus the interactions' remainder when exact."""
    import plotly.graph_objects as go

    bars = [(k, v, STATUS_COLORS["ok"]) for k, v in imp.shares.items()]
    if imp.interaction is not None:
        bars.append(("(interactions)", imp.interaction, "#999999"))
    bars.reverse()  # barh draws bottom-up
    names, values, colors = [b[0] for b in bars], [b[1] for b in bars], [b[2] for b in bars]
    # a tiny share is not nothing: "<0.1%" rather than a misleading "0.0%"
    texts = [f"{v:.1%}" if v >= 0.001 or v == 0 else "<0.1%" for v in values]
    title = importance_title(imp)
    axis = "share of the variance" + (" of log time" if imp.method == EXACT else " (fANOVA)")
    fig = go.Figure(
        go.Bar(
            x=values,
            y=names,
            orientation="h",
            marker_color=colors,
            text=texts,
            textposition="auto",
        )
    )
    fig.update_xaxes(title=axis, range=[0, 1], tickformat=".0%")
    _add_plotly(plots, "importance", fig, title)
    plt = _matplotlib()
    mfig, ax = plt.subplots(figsize=(8, max(2.6, 0.5 * len(bars) + 1.5)), layout="constrained")
    ax.barh(names, values, color=colors)
    for i, (v, t) in enumerate(zip(values, texts, strict=True)):
        ax.text(v + 0.01, i, t, va="center", fontsize=9)
    ax.set_xlim(0, 1.1)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(axis)
    plots.png["importance"] = _png(mfig)
    plots.captions["importance"] = imp.note[:1].upper() + imp.note[1:] + "."


def _has_complete(study: optuna.Study) -> bool:
    from optuna.trial import TrialState

    return bool(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


# ---------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;
padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#666;font-style:italic}.ok{color:#2a7ab0}.rejected{color:#e08a1e}
.failed{color:#c0392b}img{max-width:100%}.big{font-size:1.3em;font-weight:bold}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _num(x: Any, fmt: str = "{:.3f}") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return _e(x)
    return "-" if math.isnan(v) else fmt.format(v)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int]) -> str:
    """Cells are escaped here; a cell given as ('html', text) is trusted markup."""
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in header), "</tr>"]
    for row in rows:
        out.append("<tr>")
        for i, cell in enumerate(row):
            cls = ' class="num"' if i in numeric else ""
            text = cell[1] if isinstance(cell, tuple) else _e(cell)
            out.append(f"<td{cls}>{text}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _status(status: str) -> tuple[str, str]:
    return ("html", f'<span class="{_e(status)}">{_e(status)}</span>')


def _summary_html(s: Summary | None) -> str:
    if s is None:
        return '<p class="note">No summary: PyTorch\'s default has no valid measurement.</p>'
    rows = [
        ["PyTorch default", s.baseline_label, *s.baseline, "1.00x"],
        [
            "recommended",
            s.tuned_label,
            *s.tuned,
            f"{s.speedup:.2f}x [{s.speedup_ci[0]:.2f}, {s.speedup_ci[1]:.2f}]",
        ],
    ]
    table = _table(
        ["", "settings", "median ms", "CI low ms", "CI high ms", "speedup [95% CI]"],
        [[r[0], r[1], _num(r[2]), _num(r[3]), _num(r[4]), r[5]] for r in rows],
        {2, 3, 4},
    )
    err = (
        f"{s.rel_error:.1e} ({s.precision}, tolerance {s.tolerance:.0e})"
        if s.rel_error is not None and s.tolerance is not None
        else s.precision
    )
    return (
        f'<p class="big">{s.speedup:.2f}x faster than PyTorch\'s default '
        f"(95% CI {s.speedup_ci[0]:.2f}–{s.speedup_ci[1]:.2f})</p>{table}"
        f"<p><b>Why:</b> {_e(s.why)}<br><b>Error vs fp32 reference:</b> {_e(err)}<br>"
        f"<b>Trials:</b> {s.trials} ({s.rejected} rejected, {s.failed} failed)</p>"
    )


def _single_changes_html(df: pd.DataFrame) -> str:
    """Rows whose label names exactly one change: what each change gives on its own."""
    if "memory_format" in df.columns:
        singles = df[df.apply(_is_single_change, axis=1)]
    else:
        singles = df[~df["label"].astype(str).str.contains(",") & (df["label"] != "default")]
    if singles.empty:
        return '<p class="note">No single-change candidate was measured.</p>'
    base = df[df["label"] == "default"]
    rows = [
        [
            r["label"],
            _num(r["median_ms"]),
            _ratio_text(base.iloc[0] if len(base) else None, r),
            _status(str(r["status"])),
            r.get("reason", ""),
        ]
        for _, r in singles.sort_values("median_ms", na_position="last").iterrows()
    ]
    return _table(["change", "median ms", "vs default [95% CI]", "status", "why"], rows, {1, 2})


def _ratio_text(base: pd.Series | None, row: pd.Series) -> str:
    """Default/candidate medians with the conservative interval advisor.timing.speedup uses."""
    if base is None or math.isnan(float(row["median_ms"])):  # no timing
        return "-"
    ratio = base["median_ms"] / row["median_ms"]
    lo, hi = base["ci_low_ms"] / row["ci_high_ms"], base["ci_high_ms"] / row["ci_low_ms"]
    return f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}]"


def _is_single_change(row: pd.Series) -> bool:
    from advisor.knobs import KNOB_NAMES, Settings

    default = Settings()
    changed = sum(
        str(row[k]) != str(getattr(default, k)) for k in KNOB_NAMES if k in row and row[k] == row[k]
    )
    return changed == 1 and not str(row.get("layers", "") or "")


def _bad_html(df: pd.DataFrame) -> str:
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return "<p>Every candidate ran and passed the numeric gate.</p>"
    rows = [
        [
            r["label"],
            _status(str(r["status"])),
            failure_kind(str(r["status"]), str(r.get("reason", ""))),
            r.get("reason", ""),
            _num(r["median_ms"]),
        ]
        for _, r in bad.iterrows()
    ]
    return _table(["settings", "status", "kind", "why", "median ms"], rows, {4})


def _layers_html(data: ReportData) -> str:
    layers = data.config.settings.layers if data.config is not None else {}
    parts = []
    if layers:
        parts.append(
            _table(["layer", "implementation"], [[k, v] for k, v in layers.items()], set())
        )
    elif data.config is not None:
        impl = data.config.settings.conv_impl
        parts.append(
            f"<p>Every conv layer uses <b>{_e(impl)}</b> "
            "(no layer got a different implementation).</p>"
        )
    if data.layer_rows:
        with_roof = any(r.get("roofline") is not None for r in data.layer_rows)
        header = ["layer (signature | input shape)", "under", "implementation", "median ms"]
        header += ["status", "roofline fraction"] if with_roof else ["status"]
        header += ["why"]
        rows = []
        for r in data.layer_rows:
            row = [r["layer"], r.get("under", ""), r["impl"], _num(r["median_ms"])]
            row.append(_status(r["status"]))
            if with_roof:
                roof = r.get("roofline")
                row.append("-" if roof is None else f"{roof:.0%}")
            rows.append([*row, r["reason"]])
        parts.append(
            "<p>Each layer timed alone with each implementation, under the global settings "
            "named:</p>"
        )
        parts.append(_table(header, rows, {3, 5} if with_roof else {3}))
    roof = _workload_roofline(data)
    if roof:
        parts.append(f"<p>{_e(roof)}</p>")
    return "".join(parts) or '<p class="note">No per-layer information.</p>'


def _workload_roofline(data: ReportData) -> str | None:
    """For a single-layer workload: how close default and recommended came to the floor."""
    cfg, s = data.config, data.summary
    if cfg is None or s is None or cfg.workload.get("kind") != "layer":
        return None
    spec = cfg.workload.get("spec")
    if not isinstance(spec, dict):
        return None
    base = roofline_fraction_of(spec, cfg.mode, s.baseline[0], data.environment)
    tuned = roofline_fraction_of(spec, cfg.mode, s.tuned[0], data.environment)
    if base is None or tuned is None:
        return None
    return (
        f"Roofline fraction (this machine's floor for the layer's FLOPs and bytes, over the "
        f"measured time): PyTorch's default {base:.0%}, the recommendation {tuned:.0%}."
    )


def _env_html(env: dict[str, Any]) -> str:
    if not env:
        return '<p class="note">No environment recorded.</p>'
    rows = [[k, "-" if v is None else v] for k, v in env.items()]
    return _table(["", "value"], rows, set())


def _trials_html(df: pd.DataFrame) -> str:
    cols = [
        c
        for c in (
            "trial",
            "label",
            "status",
            "median_ms",
            "ci_low_ms",
            "ci_high_ms",
            "speedup",
            "rel_error",
            "grad_error",
            "precision",
            "samples",
            "first_call_ms",
            "peak_memory_mb",
        )
        if c in df.columns
    ]
    fmts = {
        "speedup": "{:.2f}x",
        "rel_error": "{:.1e}",
        "grad_error": "{:.1e}",
        "samples": "{:.0f}",
    }
    rows = []
    for _, r in df.iterrows():
        row: list[Any] = []
        for c in cols:
            if c == "status":
                row.append(_status(str(r[c])))
            elif c in ("label", "precision", "trial"):
                row.append(r[c])
            else:
                row.append(_num(r[c], fmts.get(c, "{:.3f}")))
        rows.append(row)
    numeric = {i for i, c in enumerate(cols) if c not in ("label", "status", "precision")}
    return _table(cols, rows, numeric)


def _plot_html(plots: Plots, name: str) -> str:
    caption = f"<p>{_e(plots.captions[name])}</p>" if name in plots.captions else ""
    if name in plots.html:
        return plots.html[name] + caption
    if name in plots.png:
        b64 = base64.b64encode(plots.png[name]).decode()
        return f'<img alt="{_e(name)} plot" src="data:image/png;base64,{b64}">{caption}'
    return f'<p class="note">Not shown: {_e(plots.notes.get(name, "not available"))}.</p>'


def render_html(data: ReportData, plots: Plots, png_names: dict[str, str]) -> str:
    from advisor import __version__

    files = ", ".join(png_names.values())
    sections = [
        ("Summary", _summary_html(data.summary)),
        ("Time per candidate", _plot_html(plots, "time")),
        ("Optimisation history", _plot_html(plots, "history")),
        ("Knob importance", _plot_html(plots, "importance")),
        ("What each single change gives on its own", _single_changes_html(data.trials)),
        ("Per-layer implementations", _layers_html(data)),
        ("Rejected and failed candidates", _bad_html(data.trials)),
        ("All trials", _trials_html(data.trials)),
        ("Environment (where this was measured)", _env_html(data.environment)),
    ]
    body = "".join(f"<h2>{_e(t)}</h2>{content}" for t, content in sections)
    notes = "".join(f"<li>{_e(n)}</li>" for n in data.notes)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>advisor report: {_e(data.title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_e(data.title)} <small>({_e(data.mode)})</small></h1>"
        f"<p>Source: {_e(data.source)}; advisor {_e(__version__)}. PNG plots: {_e(files)}.</p>"
        f'<ul class="note">{notes}</ul>{body}</body></html>\n'
    )


# ---------------------------------------------------------------- writing


def _atomic_write_bytes(path: Path, payload: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _readable(*paths: Path) -> None:
    """Temporary files are created 0600; give the report the usual umask-based mode."""
    mask = os.umask(0)
    os.umask(mask)
    for p in paths:
        p.chmod(0o666 & ~mask)


def png_dir(out: Path) -> Path:
    """report.html -> report_files/ (the browser convention for a page's companions)."""
    return out.with_name(out.stem + "_files")


def write_report(source: str, out: str | Path, storage: str | None = None) -> Path:
    """Build the report for `source` and write `out` (HTML) and its PNGs; returns `out`."""
    out = Path(out)
    if out.is_dir():
        raise AdvisorError(f"--out {out} is a directory")
    data = load_report_data(source, storage)
    plots = make_plots(data)
    folder = png_dir(out)
    names = {k: f"{folder.name}/{k}.png" for k in plots.png}
    page = render_html(data, plots, names)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for k, payload in plots.png.items():
            _atomic_write_bytes(folder / f"{k}.png", payload)
        atomic_write(out, page)
        _readable(out, *(folder / f"{k}.png" for k in plots.png))
    except OSError as e:
        raise AdvisorError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def cli_report(args: argparse.Namespace) -> int:
    out = write_report(args.source, args.out, args.storage)
    print(f"Wrote {out} (plots in {png_dir(out)}/)")
    return 0
