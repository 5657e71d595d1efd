"""What each effort level costs and answers: `advisor advise` at quick, default and full on one
model, and a second run that reuses the first.

Each run is the CLI a user types, in a subprocess, timed end to end (Python's start-up and imports
included), with `--storage memory` (nothing reused between levels). Its row: the wall time; when
the eager answer was printed (default and full write it before the compile stage); the time less
cold compiles (`stage_s` total minus `compile: cold compiles`); the harness share (the wall time
outside the candidates' timed samples, over the run's: `advisor.stages.walltime`); the candidates
measured and the median wall time each cost; the pick, its speedup over the default and its final
check. `--reuse` adds two runs at default effort with the default storage in an empty cache
folder: the second reuses the first, and its wall time is shown against it. `--after-quick` adds
quick then default effort with the default storage in another empty cache folder, as a user
who asks "which flags?" first: default knows quick's precision verdicts
(`advisor.search.shared_checks`), and its global knobs' time is shown against the memory row's.

    python benchmarks/effort_levels.py --device cpu --out benchmarks/results/effort_levels_cpu.md
    python benchmarks/effort_levels.py --device cuda --budget full=180 \
        --out benchmarks/results/effort_levels_cuda_h200.md

The markdown goes to --out and the raw rows beside it (.json), rewritten after every run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from advise_walltime import _environment_line, _label  # noqa: E402

EFFORTS = ("quick", "default", "full")
EXAMPLE = ROOT / "advisor" / "examples" / "small_cnn.py"
EAGER = "Eager answer:"


def advise(model: Path, args: argparse.Namespace, effort: str, storage: str | None = "memory",
           env: dict[str, str] | None = None, keep: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """One `advisor advise` run: its row (see the module's docstring), or its error; its config
    is copied to `keep` where given (its trials and layers tables beside it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.json"
        cmd = [sys.executable, "-m", "advisor", "advise", str(model), "--mode", args.mode,
               "--device", args.device, "--effort", effort, "--out", str(cfg)]  # fmt: skip
        if storage is not None:
            cmd += ["--storage", storage]
        budget = dict(b.split("=", 1) for b in args.budget or [])
        if effort in budget:
            cmd += ["--budget", budget[effort]]
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        run_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        start = time.perf_counter()
        eager_s = None
        tail: list[str] = []
        p = subprocess.Popen(cmd, cwd=tmp, env=run_env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert p.stderr is not None
        try:
            for line in p.stderr:  # as the run prints it: when the eager answer came
                if eager_s is None and EAGER in line:
                    eager_s = time.perf_counter() - start
                tail = (tail + [line.rstrip()])[-40:]
                if time.perf_counter() - start > args.timeout:
                    p.kill()
                    break
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        wall = time.perf_counter() - start
        row: dict[str, Any] = {"effort": effort, "wall_s": round(wall, 2), "eager_s": eager_s}
        if p.returncode != 0 or not cfg.exists():
            row["error"] = next((ln for ln in reversed(tail) if ln.strip()), f"exit {p.returncode}")
            return row
        data = json.loads(cfg.read_text())
        if keep is not None:  # the config and its trials table, for a look at a run afterwards
            keep.write_text(cfg.read_text())
            for extra in (".trials.csv", ".layers.csv"):
                if cfg.with_suffix(extra).exists():
                    keep.with_suffix(extra).write_text(cfg.with_suffix(extra).read_text())
        result = data.get("result") or {}
        stage_s = result.get("stage_s") or {}
        total = stage_s.get("total", 0.0)
        row.update(
            pick=_label(data["settings"]),
            settings=data["settings"],
            speedup=result.get("speedup"),
            speedup_ci=result.get("speedup_ci"),
            final_check=(result.get("final_check") or {}).get("held"),
            stage_s=stage_s,
            less_cold_s=total - stage_s.get("compile: cold compiles", 0.0),
            gate_compiles_s=stage_s.get("compile: gate's compiles", 0.0),
            harness=(1 - stage_s["timed samples"] / total) if total and "timed samples" in
            stage_s else None,
            notes=result.get("notes", []),
        )
        trials = cfg.with_suffix(".trials.csv")
        if trials.exists():
            with trials.open() as f:
                walls = [float(r["wall_s"]) for r in csv.DictReader(f) if r.get("wall_s")]
            row["candidates"] = len(walls)
            row["candidate_wall_s"] = statistics.median(walls) if walls else None
        return row


def _cell(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def report(rows: list[dict[str, Any]], reuse: list[dict[str, Any]], machine: str,
           args: argparse.Namespace, after: list[dict[str, Any]] | None = None) -> str:  # fmt: skip
    lines = [f"# Effort levels: `advisor advise {args.model} --mode {args.mode} --device "
             f"{args.device}`", "", machine, "",
             f"Command: `python benchmarks/effort_levels.py {' '.join(sys.argv[1:])}`", "",
             "Wall: the CLI end to end. Eager: when the eager answer was printed and written. "
             "Less cold compiles: the run's total less its cold compiles. Harness: the share of "
             "the run outside the candidates' timed samples. Per candidate: the median wall "
             "time of one candidate's trial (building, warming up, timing, gating).", "",
             "| effort | wall s | eager s | less cold compiles s | harness | candidates | per "
             "candidate s | pick | speedup [95% CI] | final check |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['effort']} | {r['wall_s']:.1f} | | | | | | error: {r['error']} "
                         "| | |")  # fmt: skip
            continue
        ci = r.get("speedup_ci") or [None, None]
        speed = (f"{r['speedup']:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]" if r.get("speedup") and
                 ci[0] is not None else "-")  # fmt: skip
        held = {True: "held", False: "not held", None: "none"}[r.get("final_check")]
        lines.append(
            f"| {r['effort']} | {r['wall_s']:.1f} | {_cell(r.get('eager_s'))} | "
            f"{_cell(r.get('less_cold_s'))} | {_cell(r.get('harness'), '{:.0%}')} | "
            f"{r.get('candidates', '-')} | {_cell(r.get('candidate_wall_s'), '{:.2f}')} | "
            f"`{r['pick']}` | {speed} | {held} |"
        )
    for r in rows:
        if r.get("stage_s"):
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["stage_s"].items())
            lines += ["", f"{r['effort']}, seconds by stage: {parts}"]
    if reuse:
        lines += ["", "Reuse (default effort, the default storage in an empty cache folder):", ""]
        lines += ["| run | wall s | pick |", "| --- | ---: | --- |"]
        for i, r in enumerate(reuse):
            lines.append(f"| {'first' if i == 0 else 'second'} | {r['wall_s']:.1f} | "
                         f"`{r.get('pick', r.get('error'))}` |")  # fmt: skip
        if len(reuse) == 2 and "error" not in reuse[0] and "error" not in reuse[1]:
            lines += ["", f"Second / first: {reuse[1]['wall_s'] / reuse[0]['wall_s']:.0%}."]
    if after:
        lines += _after_quick(after, [r for r in rows if r["effort"] == "default"])
    return "\n".join(lines) + "\n"


KNOBS, CHECKS = "global knobs", "global knobs: precision checks"


def _after_quick(after: list[dict[str, Any]], alone: list[dict[str, Any]]) -> list[str]:
    """The quick-then-default section: each run's wall, global knobs and their precision
    checks, beside the default row of the table (`--storage memory`: judged afresh)."""
    lines = ["", "Default after quick (the default storage in an empty cache folder; the first "
             "row: default alone, from the table):", "",
             "| run | wall s | global knobs s | precision checks s | pick |",
             "| --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    named = [("default alone", r) for r in alone[:1]]
    named += [(f"{r['effort']} (after quick)" if i else r["effort"], r) for i, r in enumerate(after)]
    for name, r in named:
        if "error" in r:
            lines.append(f"| {name} | {r['wall_s']:.1f} | | | error: {r['error']} |")
            continue
        st = r.get("stage_s") or {}
        lines.append(f"| {name} | {r['wall_s']:.1f} | {_cell(st.get(KNOBS))} | "
                     f"{_cell(st.get(CHECKS, 0.0))} | `{r['pick']}` |")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(EXAMPLE.relative_to(ROOT)),
                    help="model file (default: the bundled example)")  # fmt: skip
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--efforts", nargs="+", default=list(EFFORTS), choices=EFFORTS)
    ap.add_argument("--budget", action="append", metavar="EFFORT=TIME",
                    help="advise's --budget for one effort, e.g. full=180 (repeatable)")
    ap.add_argument("--reuse", action="store_true", help="also time a run that reuses another")
    ap.add_argument("--after-quick", action="store_true",
                    help="also time default effort after quick, in one cache folder")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    ap.add_argument("--out", help="markdown file (the raw rows beside it, .json)")
    args = ap.parse_args()
    model = Path(args.model) if Path(args.model).is_absolute() else ROOT / args.model
    if not model.exists():
        ap.error(f"no model file {model}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    machine = _environment_line(args.device)
    rows: list[dict[str, Any]] = []
    reuse: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []

    def write() -> str:
        text = report(rows, reuse, machine, args, after)
        if args.out:
            Path(args.out).write_text(text)
            raw = {"machine": machine, "argv": sys.argv[1:], "rows": rows, "reuse": reuse,
                   "after_quick": after}  # fmt: skip
            Path(args.out).with_suffix(".json").write_text(json.dumps(raw, indent=1))
        return text

    for effort in args.efforts:
        print(f"{effort} ...", flush=True)
        rows.append(advise(model, args, effort))
        print(f"  {rows[-1]['wall_s']:.1f} s: {rows[-1].get('pick', rows[-1].get('error'))}")
        write()
    if args.reuse:
        with tempfile.TemporaryDirectory() as cache:
            for i in range(2):
                print(f"reuse, run {i + 1} ...", flush=True)
                reuse.append(advise(model, args, "default", storage=None,
                                    env={"ADVISOR_CACHE_DIR": cache}))  # fmt: skip
                print(f"  {reuse[-1]['wall_s']:.1f} s")
                write()
    if args.after_quick:
        with tempfile.TemporaryDirectory() as cache:
            for effort in ("quick", "default"):
                print(f"{effort}, the default storage ...", flush=True)
                after.append(advise(model, args, effort, storage=None,
                                    env={"ADVISOR_CACHE_DIR": cache}))  # fmt: skip
                print(f"  {after[-1]['wall_s']:.1f} s")
                write()
    print(write())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
