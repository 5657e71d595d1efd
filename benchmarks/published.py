"""`advisor advise` on published models no test used before issue 42: a row per model, as a user
would meet it.

Each model of benchmarks/published_models.py (torchvision, timm, MONAI and transformers, built
from a small config with no downloaded weights) is advised in a subprocess exactly as a user
runs it, `python -m advisor advise benchmarks/published_models.py --build build_<name> --inputs
inputs_<name> --mode train --device cpu --storage memory --out cfg.json` (default space and
effort), and timed end to end. A row gives the wall time, the cold compiles (how many compiled
candidates paid one, and their seconds), the pick, the final check (where it ran, the speedup
with its 95% interval, held or not; or why none was needed), the conv layers kept native with
their reason, or the one-line reason the run stopped. A traceback in any run is counted apart.
A model whose library does not import here is a skipped row with that reason.

    python benchmarks/published.py --out benchmarks/results/published_cpu.md
    python benchmarks/published.py --models wav2vec2 hifigan --out /tmp/published.md

The markdown goes to --out and the raw runs beside it (.json), both rewritten after every model.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from advise_walltime import _label  # noqa: E402  (a pick's label without PyTorch's defaults)
from published_models import MODELS, Published  # noqa: E402

MODEL_FILE = HERE / "published_models.py"
IMPORT_ERROR = re.compile(r"(ModuleNotFoundError|ImportError)|operator torchvision::\w+ does not")


def advise(p: Published, mode: str, device: str, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.json"
        cmd = [sys.executable, "-m", "advisor", "advise", str(MODEL_FILE), "--build",
               f"build_{p.name}", "--inputs", f"inputs_{p.name}", "--mode", mode, "--device",
               device, "--storage", "memory", "--out", str(cfg), "--quiet"]  # fmt: skip
        start = time.perf_counter()
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"wall_s": timeout_s, "stopped": f"still running after {timeout_s:.0f} s"}
        run: dict[str, Any] = {"wall_s": time.perf_counter() - start, "rc": r.returncode}
        run["traceback"] = "Traceback (most recent call last)" in r.stderr
        if r.returncode != 0 or not cfg.exists():
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            key = "skipped" if IMPORT_ERROR.search(last) else "stopped"
            run[key] = last.removeprefix("advisor: error: ")
            return run
        data = json.loads(cfg.read_text())
        trials = cfg.with_suffix(".trials.csv")
        run["compiled_cold"] = _cold_compiles(trials) if trials.exists() else 0
        run.update(settings=data["settings"], result=data.get("result") or {})
        return run


def _cold_compiles(trials_csv: Path) -> int:
    """How many candidates paid a cold compile (the trials table's compile_cold_s)."""
    import csv

    with trials_csv.open() as f:
        return sum(1 for row in csv.DictReader(f) if (row.get("compile_cold_s") or "").strip())


def conv_classes(p: Published) -> str:
    """The model's conv classes and counts (built here once), e.g. '3 Conv1d, 1 ParametrizedConv1d'."""
    import published_models

    from advisor import impls

    try:
        model = getattr(published_models, f"build_{p.name}")()
    except Exception as e:  # noqa: BLE001 - the advise row says why; this column is a courtesy
        return f"(not built here: {type(e).__name__})"
    counts: dict[str, int] = {}
    for _, m in impls.conv_modules(model):
        counts[type(m).__name__] = counts.get(type(m).__name__, 0) + 1
    return ", ".join(f"{n} {c}" for c, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def final_check(result: dict[str, Any]) -> str:
    fc = result.get("final_check")
    if not fc:
        # No check: the pick is PyTorch's default, or it won beyond noise (a note says so).
        clear = [n for n in result.get("notes", []) if "beyond noise" in n or "no final check" in n]
        return clear[0] if clear else "none needed (the pick is PyTorch's default)"
    lo, hi = fc["speedup_ci"]
    held = "held" if fc["held"] else "did not hold: default kept"
    return f"{fc['where']}: {fc['speedup']:.2f}x [{lo:.2f}, {hi:.2f}], {held}"


def row(p: Published, run: dict[str, Any], convs: str) -> str:
    name = f"{p.name} ({p.library})"
    if "skipped" in run or "stopped" in run:
        what = "skipped" if "skipped" in run else "**stopped**"
        reason = run.get("skipped") or run.get("stopped")
        return f"| {name} | {convs} | {run['wall_s']:.0f} | - | - | {what}: {reason} | - | - |"
    res = run["result"]
    cold = res.get("stage_s", {}).get("compile: cold compiles", 0.0)
    kept = [n.split(" keeps PyTorch's forward: ")[0] for n in res.get("notes", [])
            if " keeps PyTorch's forward: " in n]  # fmt: skip
    pick = f"`{_label(run['settings'])}` ({res.get('speedup', 1.0):.2f}x in its re-time)"
    others = res.get("other_load")
    busy = f"{100 * others:.0f}%" if others is not None else "?"
    return (f"| {name} | {convs} | {run['wall_s']:.0f} | {busy} | {run['compiled_cold']} "
            f"({cold:.0f} s) | {pick} | {final_check(res)} | {'; '.join(kept) or '-'} |")  # fmt: skip


def machine_line(device: str) -> str:
    import os

    import torch

    from advisor.device.environment import cpu_description

    model = cpu_description()

    return (f"Machine: {model}, {os.cpu_count()} cores; torch {torch.__version__}; "
            f"Python {platform.python_version()}; device {device}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")  # fmt: skip


def report(
    args: argparse.Namespace,
    runs: dict[str, Any],
    machine: str,
    rev: str,
    argv: list[str] | None = None,
) -> str:
    lines = ["# `advisor advise` on published models", "", machine, ""]
    lines += [args.note, ""] if args.note else []
    lines += [
             f"Command: `python benchmarks/published.py {shlex.join((argv or sys.argv)[1:])}` at "
             f"{rev}; each "
             f"model `advisor advise ... --mode {args.mode} --device {args.device} --storage "
             "memory` with the default space and effort, in its own process.", "",
             "Others' CPU: the share of the machine's CPU time other processes used during the "
             "run (the advisor's own reading).", "",
             "| model | conv layers | wall s | others' CPU | cold compiles | pick | final check "
             "| kept native |", "| --- | --- | ---: | ---: | --- | --- | --- | --- |"]  # fmt: skip
    for p in MODELS:
        if p.name in runs:
            lines.append(row(p, runs[p.name]["run"], runs[p.name]["convs"]))
    done = [r["run"] for r in runs.values()]
    ran = [r for r in done if "settings" in r]
    lines += ["", f"{len(ran)} of {len(done)} models advised; "
              f"{sum('skipped' in r for r in done)} skipped (library does not import); "
              f"{sum('stopped' in r for r in done)} stopped; "
              f"{sum(bool(r.get('traceback')) for r in done)} with a traceback.", ""]  # fmt: skip
    lines += ["Models:", ""] + [f"- {p.name} ({p.library}): {p.what}" for p in MODELS
                                if p.name in runs]  # fmt: skip
    lines += ["", "Why each pick (the advice's own words; its notes and compile note after it):",
              ""]  # fmt: skip
    for p in MODELS:
        res = runs.get(p.name, {}).get("run", {}).get("result")
        if res:
            notes = "".join(f" Note: {n}" for n in res.get("notes", []) + res.get("warnings", []))
            if res.get("compile_note"):
                notes += f" Compile: {res['compile_note']}"
            lines.append(f"- {p.name}: {res.get('why', '?')}.{notes}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", help="names from published_models.MODELS (default all)")
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--timeout", type=float, default=1200.0, help="per advise run, seconds")
    ap.add_argument("--out", help="markdown file (the raw runs beside it, .json)")
    ap.add_argument("--note", help="a line under the machine's, e.g. what else ran on it")
    ap.add_argument("--render", metavar="JSON", help="only render an earlier run's JSON to --out")
    args = ap.parse_args()
    if args.render:
        raw = json.loads(Path(args.render).read_text())
        args.note = args.note or raw.get("note")
        text = report(args, raw["runs"], raw["machine"], raw["revision"], raw.get("command"))
        Path(args.out).write_text(text) if args.out else print(text)
        return 0
    known = {p.name: p for p in MODELS}
    unknown = [m for m in args.models or [] if m not in known]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [known[m] for m in args.models] if args.models else MODELS
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip() or "?"  # fmt: skip
    machine = machine_line(args.device)
    runs: dict[str, Any] = {}
    text = ""
    for p in chosen:
        print(f"{p.name} ...", flush=True)
        convs = conv_classes(p)
        run = advise(p, args.mode, args.device, args.timeout)
        runs[p.name] = {"convs": convs, "run": run}
        print("  " + row(p, run, convs), flush=True)
        text = report(args, runs, machine, rev)
        if args.out:  # rewritten after every model: a run cut short keeps its rows
            Path(args.out).write_text(text)
            raw = {"machine": machine, "revision": rev, "command": sys.argv, "note": args.note,
                   "runs": runs}  # fmt: skip
            Path(args.out).with_suffix(".json").write_text(json.dumps(raw, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
