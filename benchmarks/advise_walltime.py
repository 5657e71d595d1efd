"""What `advisor advise` costs a user, compared across revisions of the advisor on one machine.

For each model and each git revision, `python -m advisor advise MODEL --mode M --device D
--storage memory --out cfg.json` runs in a subprocess from a worktree of that revision (its own
code, this Python and its packages) and is timed end to end: Python start-up, imports, the search,
the numeric gate, the per-layer stage and the interleaved re-time. Revisions alternate model by
model and their order alternates with each repeat, so a machine that slows down during the run
does not favour one revision. The pick each revision wrote is shown beside its time, so a faster
search that picks something else is visible.

    python benchmarks/advise_walltime.py --revisions ce83d9e HEAD --models small_cnn resnet18 \
        --out benchmarks/results/advise_walltime_cpu.md

The models are the zoo's (benchmarks/zoo.py --list) or paths to model files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from advisor.stages.walltime import harness_share, stage_harness_share

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _model_path(name: str) -> Path:
    from zoo import MODELS  # the zoo's model list: one place names the benchmark models

    for model in MODELS:
        if model.name == name:
            return model.path
    path = Path(name)
    if not path.is_file():
        raise SystemExit(f"advise_walltime: unknown model {name!r} (not in the zoo, not a file)")
    return path.resolve()


def _worktree(rev: str, into: Path) -> tuple[str, Path]:
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = into / sha
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), sha],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return sha, path


def _advise(
    tree: Path, model: Path, mode: str, device: str, timeout_s: float, effort: str | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.json"
        cmd = [sys.executable, "-m", "advisor", "advise", str(model), "--mode", mode]
        cmd += ["--device", device, "--storage", "memory", "--out", str(cfg), "--quiet"]
        if effort is not None:  # revisions before issue 40 have no --effort: leave it out there
            cmd += ["--effort", effort]
        env = {**os.environ, "PYTHONPATH": str(tree)}  # this revision's advisor, not the installed
        start = time.perf_counter()
        r = subprocess.run(
            cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        wall = time.perf_counter() - start
        if r.returncode != 0 or not cfg.exists():
            return {"wall_s": wall, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
        data = json.loads(cfg.read_text())
        run = {"wall_s": wall, "pick": _label(data["settings"]), "settings": data["settings"]}
        stage_s = (data.get("result") or {}).get("stage_s")
        if stage_s:  # revisions from issue 30 on say where the time went
            run["stage_s"] = stage_s
        return run


# Columns the breakdown adds to a run's stage_s: its total less its cold compiles (one per
# compiled candidate: the floor a measured torch.compile costs), and its harness share, the wall
# time outside the candidates' timed samples over the run's (advisor.stages.walltime).
COLD, TIMED = "compile: cold compiles", "timed samples"
WITHOUT_COLD, HARNESS = "total less cold compiles", "harness %"
# The same share with the numeric gate's checks counted apart, as cold compiles are
# (advisor.stages.walltime.harness_share(..., gate_apart=True)); revisions before 3b36bad did
# not time the output and layer checks, so their figure counts the precision checks only.
HARNESS_APART = "harness % less the gate"
# The global knobs' stage alone (issue 40 asks its share at quick), both ways; revisions before
# the stage's own samples were recorded ("global knobs: timed samples") have no figure.
KNOBS, KNOBS_APART = "global knobs harness %", "global knobs harness % less the gate"

# The advise command's own start-up (Python, torch's import), which revisions from issue 55's
# second round count in the run's total as its first process start: left out of the totals and
# shares here (its own column stays), so revisions before and after compare alike.
OWN_START = "start-up and load: process starts"


def _alike(stage_s: dict[str, float]) -> dict[str, float]:
    own = stage_s.get(OWN_START, 0.0)
    if not own:
        return stage_s
    return {**stage_s, "total": stage_s.get("total", 0.0) - own,
            "start-up and load": stage_s.get("start-up and load", 0.0) - own}  # fmt: skip


# PyTorch's defaults as a config writes them: left out of a pick's label
DEFAULTS = {"memory_format": "contiguous", "tf32": "conv", "amp": "off", "cudnn_benchmark": False,
            "conv_impl": "native", "cpu_fp32": "ieee", "compile": "off"}  # fmt: skip


def _label(settings: dict[str, Any]) -> str:
    parts = [
        f"{k}={v}"
        for k, v in settings.items()
        if k != "layers" and v not in (None, {}) and str(DEFAULTS.get(k)) != str(v)
    ]
    layers = settings.get("layers") or {}
    if layers:
        counts: dict[str, int] = {}
        for impl in layers.values():
            counts[impl] = counts.get(impl, 0) + 1
        parts.append("layers: " + ", ".join(f"{n}x {i}" for i, n in sorted(counts.items())))
    return ", ".join(parts) or "default"


def _shorten(label: str) -> str:
    """A label written with every setting, defaults included, without the defaults."""
    parts = [
        p for p in label.split(", ") if "=" not in p or _label(dict([p.split("=", 1)])) != "default"
    ]
    return ", ".join(parts) or "default"


def _environment_line(device: str) -> str:
    from advisor.device.environment import cpu_description, current_environment

    env = current_environment(device)
    name = cpu_description() if env.device_type == "cpu" else env.device_name
    return (
        f"Machine: {name} ({env.device_type}, {env.capability}), {env.cpu_threads} "
        f"threads; torch {env.torch}; Python {env.python}; {time.strftime('%Y-%m-%d %H:%M')}."
    )


def _command() -> str:
    return f"python benchmarks/advise_walltime.py {' '.join(sys.argv[1:])}"


def _report(
    args: argparse.Namespace,
    shas: list[str],
    rows: dict[str, Any],
    machine: str | None = None,
    command: str | None = None,
) -> str:
    lines = ["# `advisor advise` wall time across revisions", ""]
    lines += [machine or _environment_line(args.device), "", f"Command: `{command or _command()}`"]
    lines += [
        "",
        f"Mode {args.mode}, device {args.device}, `--storage memory`"
        + (f", `--effort {args.effort}`" if getattr(args, "effort", None) else "")
        + f", {args.repeats} run(s) per "
        "model and revision, alternating; wall seconds (median when repeated; all runs in the "
        "JSON beside this file). Ratio: first revision / last.",
        "",
        "| model | " + " | ".join(f"{s} s | {s} pick" for s in shas) + " | ratio |",
        "| --- | " + " | ".join("---: | ---" for _ in shas) + " | ---: |",
    ]
    for name, by_rev in rows.items():
        cells, medians = [], []
        for sha in shas:
            runs = by_rev.get(sha, [])
            ok = [r for r in runs if "error" not in r]
            if not ok:
                cells += ["-", runs[-1]["error"] if runs else "not run"]
                medians.append(None)
                continue
            med = statistics.median(r["wall_s"] for r in ok)
            picks = sorted({r["pick"] for r in ok})
            cells += [f"{med:.1f}", " / ".join(f"`{p}`" for p in picks)]
            medians.append(med)
        first, last = medians[0], medians[-1]
        ratio = f"{first / last:.2f}x" if first and last else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    total = [sum(statistics.median(r["wall_s"] for r in ok) for by_rev in rows.values()
                 if (ok := [r for r in by_rev.get(sha, []) if "error" not in r]))
             for sha in shas]  # fmt: skip
    lines += ["", "Sum of the medians: " + ", ".join(f"{s} {t:.1f} s" for s, t in zip(shas, total))]
    lines += _breakdown(rows, shas[-1])
    return "\n".join(lines) + "\n"


def _breakdown(rows: dict[str, Any], sha: str) -> list[str]:
    """Where the time went at revision `sha`, stage by stage (the config's `result.stage_s`,
    median over the runs): start-up and load, the search, its precision checks, ...; none for
    revisions that did not record it."""
    stages: list[str] = []
    table: dict[str, dict[str, float]] = {}
    for name, by_rev in rows.items():
        runs = [r["stage_s"] for r in by_rev.get(sha, []) if "stage_s" in r]
        if not runs:
            continue
        for run in runs:
            stages += [k for k in run if k not in stages]
        runs = [_alike(r) for r in runs]
        table[name] = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in stages}
        total, cold = table[name].get("total", 0.0), table[name].get(COLD, 0.0)
        table[name][WITHOUT_COLD] = total - cold
        # the shares: each run's, then their median
        shares = {
            HARNESS: lambda r: harness_share(r),
            HARNESS_APART: lambda r: harness_share(r, gate_apart=True),
            KNOBS: lambda r: stage_harness_share(r, "global knobs")
            if f"global knobs: {TIMED}" in r else None,
            KNOBS_APART: lambda r: stage_harness_share(r, "global knobs", gate_apart=True)
            if f"global knobs: {TIMED}" in r else None,
        }  # fmt: skip
        for key, share_of in shares.items():
            got = [x for r in runs if (x := share_of(r)) is not None]
            if got:
                table[name][key] = 100.0 * statistics.median(got)
    if not table:
        return []
    stages += [k for k in (WITHOUT_COLD, HARNESS, HARNESS_APART, KNOBS, KNOBS_APART)
               if any(k in row for row in table.values())]  # fmt: skip
    lines = ["", f"Where the time went at {sha}, seconds by stage (the config's `result.stage_s`; "
             "a 'stage: part' column is part of that stage; 'advise' wall above also counts "
             "Python's start-up and imports):", ""]  # fmt: skip
    lines += ["| model | " + " | ".join(stages) + " |", "| --- |" + " ---: |" * len(stages)]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(f"{row.get(k, 0.0):.1f}" for k in stages) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--revisions", nargs="+", help="git revisions, oldest first")
    ap.add_argument("--models", nargs="+", help="zoo names or model files")
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--effort", choices=["quick", "default", "full"],
                    help="advise's --effort (default: left out, as revisions before it need)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per advise run, seconds")
    ap.add_argument("--out", help="markdown file (the raw runs beside it, .json)")
    ap.add_argument("--render", metavar="JSON", help="only render a earlier run's JSON to --out")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        if "rows" not in saved:  # the first format: the rows alone, revisions in run order
            saved = {"rows": saved, "revisions": list(next(iter(saved.values())))}
        rows = saved["rows"]
        for by_rev in rows.values():
            for runs in by_rev.values():
                for run in runs:
                    if "settings" in run:
                        run["pick"] = _label(run["settings"])
                    elif "pick" in run:  # written before settings were kept: drop the defaults
                        run["pick"] = _shorten(run["pick"])
        command = saved.get("command") or f"(the run's command was not kept; {_command()})"
        text = _report(args, saved["revisions"], rows, saved.get("machine"), command)
        Path(args.out).write_text(text) if args.out else print(text)
        return 0
    if not args.revisions or not args.models:
        ap.error("--revisions and --models are needed (or --render)")
    if args.out:  # written after the first model: a folder that is not there fails now, not then
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"cannot write --out {args.out}: {e.strerror or e}")

    models = {name: _model_path(name) for name in args.models}
    machine = _environment_line(args.device)
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in models}
    with tempfile.TemporaryDirectory() as tmp:
        trees = [_worktree(rev, Path(tmp)) for rev in args.revisions]
        shas = [sha for sha, _ in trees]
        try:
            turn = 0
            for repeat in range(args.repeats):
                for name, path in models.items():
                    order = trees if turn % 2 == 0 else trees[::-1]
                    turn += 1
                    for sha, tree in order:
                        print(f"{name} @ {sha} (run {repeat + 1}) ...", flush=True)
                        run = _advise(tree, path, args.mode, args.device, args.timeout,
                                      args.effort)  # fmt: skip
                        rows[name].setdefault(sha, []).append(run)
                        print(f"  {run['wall_s']:.1f} s: {run.get('pick', run.get('error'))}")
                    text = _report(args, shas, rows, machine)
                    if args.out:  # rewritten after every model: a run cut short keeps its rows
                        Path(args.out).write_text(text)
                        raw = {"command": _command(), "machine": machine, "revisions": shas}
                        raw["rows"] = rows
                        Path(args.out).with_suffix(".json").write_text(json.dumps(raw, indent=1))
        finally:
            for _, tree in trees:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)],
                    cwd=ROOT,
                    capture_output=True,
                )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
