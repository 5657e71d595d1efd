"""The report's plots, made in memory: matplotlib figures as PNG bytes, plotly figures as HTML divs.

Time per candidate (matplotlib only), optuna's optimisation history and the knob importance
(both kinds each). A plot that cannot be drawn leaves a note saying why instead.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from advisor.errors import first_line
from advisor.report.importance import EXACT, Importance, knob_importance

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from matplotlib.figure import Figure

    from advisor.report.load import ReportData

STATUS_COLORS = {"ok": "#2a7ab0", "rejected": "#e08a1e", "failed": "#c0392b", "stopped": "#888888"}


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


def _optuna_plot(make: Callable[[], Any]) -> tuple[Any, str | None]:
    """Call an optuna plot function; (figure, None) or (None, why it could not be drawn)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna's matplotlib backend is "experimental"
            return make(), None
    except (ValueError, RuntimeError, ZeroDivisionError, ImportError) as e:
        return None, first_line(e, with_type=False)


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
    cfg = data.config
    tuned = cfg.settings.label() if cfg is not None and cfg.result is not None else None
    fig = time_figure(data.trials, "default" if tuned is not None else None, tuned)
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
        fig, why_fig = _optuna_plot(lambda: vis.plot_optimization_history(study, **kw))
        ax, why_mpl = _optuna_plot(lambda: vis_mpl.plot_optimization_history(study, **kw))
        if fig is None or ax is None:
            plots.notes["history"] = why_fig or why_mpl or "not computable"
        else:
            _add_plotly(plots, "history", fig, title)
            _polish(ax, title, "trial number")
            mpl_fig = ax.figure
            mpl_fig.set_size_inches(8, 4.5)
            mpl_fig.tight_layout()
            plots.png["history"] = _png(mpl_fig)
    imp, why_imp = _optuna_plot(lambda: knob_importance(study))
    if imp is None:
        plots.notes["importance"] = why_imp or "not computable"
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
