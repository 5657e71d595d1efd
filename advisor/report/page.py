"""The report's HTML page: one self-contained file that needs no network.

optuna's plotly figures carry plotly.js inline (once), matplotlib plots are embedded as base64
PNGs; every table cell is escaped unless it is marked as trusted markup.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from advisor.report.layer_rows import default_precision, roofline_of
from advisor.report.progress import kind_beside

if TYPE_CHECKING:
    import pandas as pd

    from advisor.config import Config
    from advisor.report.load import ReportData
    from advisor.report.plots import Plots

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;
padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#666;font-style:italic}.ok{color:#2a7ab0}.rejected{color:#e08a1e}
.failed{color:#c0392b}.stopped{color:#888}img{max-width:100%}.big{font-size:1.3em;font-weight:bold}
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


def _summary_html(cfg: Config | None) -> str:
    s = cfg.result if cfg is not None else None
    if cfg is None or s is None:
        return '<p class="note">No summary: PyTorch\'s default has no valid measurement.</p>'
    gain = f"{s.speedup:.2f}x [{s.speedup_ci[0]:.2f}, {s.speedup_ci[1]:.2f}]"
    rows = [
        ("PyTorch default", "default", s.baseline, "1.00x"),
        ("recommended", cfg.settings.label(), s.tuned, gain),
    ]
    table = _table(
        ["", "settings", "median ms", "CI low ms", "CI high ms", "speedup [95% CI]"],
        [
            [a, b, _num(t.median_ms), _num(t.ci_low_ms), _num(t.ci_high_ms), c]
            for a, b, t, c in rows
        ],
        {2, 3, 4},
    )
    err = f"{s.rel_error:.1e} ({s.precision}, tolerance {s.tolerance:.0e})"
    return (
        f'<p class="big">{s.speedup:.2f}x faster than PyTorch\'s default '
        f"(95% CI {s.speedup_ci[0]:.2f}–{s.speedup_ci[1]:.2f})</p>{table}"
        f"<p><b>Why:</b> {_e(s.why)}</p>"
        + (f"<ol>{''.join(f'<li>{_e(step)}</li>' for step in s.path)}</ol>" if s.path else "")
        + f"<p><b>Error vs fp32 reference:</b> {_e(err)}<br>"
        f"<b>Trials:</b> {s.trials} ({s.rejected} rejected, {s.failed} failed)</p>"
        + "".join(f"<p><b>Precision:</b> {_e(line)}</p>" for line in s.precisions)
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
    """Default/candidate medians with the conservative interval advisor.measure.stats.speedup uses."""
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
            kind_beside(str(r["status"]), str(r.get("kind", ""))),
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
        with_roof = any(
            r.get("roofline") is not None or r.get("roofline_at") for r in data.layer_rows
        )
        header = ["layer (signature | input shape)", "under", "implementation", "median ms"]
        header += ["status", "roofline fraction (at)"] if with_roof else ["status"]
        header += ["why"]
        rows = []
        for r in data.layer_rows:
            row = [r["layer"], r.get("under", ""), r["impl"], _num(r["median_ms"])]
            row.append(_status(r["status"]))
            if with_roof:
                roof, at = r.get("roofline"), r.get("roofline_at", "")
                if roof is not None:
                    row.append(f"{roof:.0%} {at}".strip())
                else:
                    row.append(f"- ({at})" if at else "-")
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
    cfg = data.config
    s = cfg.result if cfg is not None else None
    if cfg is None or s is None or cfg.workload.get("kind") != "layer":
        return None
    spec = cfg.workload.get("spec")
    if not isinstance(spec, dict):
        return None
    env = data.environment
    base, base_at = roofline_of(
        spec, cfg.mode, s.baseline.median_ms, env, default_precision(spec, env)
    )
    tuned, tuned_at = roofline_of(spec, cfg.mode, s.tuned.median_ms, env, s.precision)
    if base is None or tuned is None:
        return None
    return (
        f"Roofline fraction (this machine's floor for the layer's FLOPs and bytes at the "
        f"precision it ran in, over the measured time): PyTorch's default {base:.0%} "
        f"({base_at} peak), the recommendation {tuned:.0%} ({tuned_at} peak)."
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
    from advisor.version import __version__

    files = ", ".join(png_names.values())
    sections = [
        ("Summary", _summary_html(data.config)),
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
