"""Quick effort against default effort on the zoo: what each costs, and whether quick's answer
is as good.

For each model (the zoo's CPU models by default, `zoo.py --list`): `advisor advise MODEL --mode
M --device D --effort E --storage memory` at quick, then at default (`effort_levels.advise`: the
CLI in a subprocess, timed end to end, imports included). Then PyTorch's default, quick's pick
and default effort's pick are re-timed together in a fresh process, interleaved
(`fresh_retime.retime_variants`, the settings applied with `advisor.apply`; a compiled pick is
compiled there and its first call kept out of the samples). Where both levels picked the same
settings there is nothing to compare and no re-time.

A row: each level's wall time; default's time less its cold compiles, when its eager answer was
printed and its harness share (the run's time outside the candidates' timed samples); both
picks; and quick's pick against default's in the fresh re-time (default pick's time / quick
pick's, with its 95% interval: 1.00x is as fast, below is slower), within 5% or not. Issue 40
asks: quick at most 25 s, within 5% of default's pick or saying why; default at most 35 s less
cold compiles for each model and 150 s for all together.

    python benchmarks/quick_vs_default.py --out benchmarks/results/quick_vs_default_cpu_train.md

The markdown goes to --out and the raw rows beside it (.json), rewritten after every model; each
run's config and trials table go to a folder beside it (--out without its suffix).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from advise_walltime import _environment_line  # noqa: E402
from effort_levels import advise  # noqa: E402
from fresh_retime import retime_variants  # noqa: E402
from zoo import MODELS, speedup_of  # noqa: E402

WITHIN = 0.05  # quick's pick may be this much slower than default's (issue 40)


def compare(cfg: Path, quick: dict[str, Any], default: dict[str, Any], args: argparse.Namespace,
            ) -> dict[str, Any]:  # fmt: skip
    """Quick's pick against default's, re-timed with PyTorch's default in a fresh process."""
    if quick["settings"] == default["settings"]:
        return {"same": True}
    variants = {"default": {}, "quick": quick["settings"], "default_effort": default["settings"]}
    try:
        got = retime_variants(cfg, variants, args.mode, args.device, rounds=args.rounds,
                              timeout_s=args.timeout)  # fmt: skip
    except RuntimeError as e:
        return {"error": str(e)}
    errors = [f"{k}: {v['error']}" for k, v in got.items() if "error" in v]
    if errors:
        return {"error": "; ".join(errors), "retime": got}
    # default pick's time / quick pick's: above 1.00x quick's pick is the faster
    return {"same": False, "retime": got,
            "ratio": speedup_of(got.get("default_effort"), got.get("quick"))}  # fmt: skip


def verdict(cmp: dict[str, Any]) -> str:
    if cmp.get("same"):
        return "same pick"
    if "error" in cmp or cmp.get("ratio") is None:
        return f"re-time failed: {cmp.get('error', 'no samples')}"
    ratio, lo, hi = cmp["ratio"]
    ok = "within 5%" if ratio >= 1 / (1 + WITHIN) else "NOT within 5%"
    return f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}]: {ok}"


def report(rows: list[dict[str, Any]], machine: str) -> str:
    lines = [
        "# Quick against default effort on the zoo", "", machine, "",
        f"Command: `python benchmarks/quick_vs_default.py {' '.join(sys.argv[1:])}`", "",
        "Quick s / default s: the CLI end to end at each effort. Less cold: default's run total "
        "less its cold compiles (in brackets: less the gate's compiles under dropout masks too). Eager s: when default printed its eager answer. Harness: "
        "default's time outside the candidates' timed samples. Quick vs default pick: default "
        "pick's time / quick pick's in one fresh-process re-time with PyTorch's default "
        "(1.00x: as fast; below: quick's pick is slower), 95% interval.", "",
        "| model | quick s | default s | less cold s | eager s | harness | quick pick | "
        "default pick | quick vs default pick |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]  # fmt: skip
    for r in rows:
        q, d = r["quick"], r["default"]
        if "error" in q or "error" in d:
            err = q.get("error") or d.get("error")
            lines.append(f"| {r['model']} | {q['wall_s']:.1f} | {d['wall_s']:.1f} | | | | "
                         f"error: {err} | | |")  # fmt: skip
            continue
        eager = "-" if d.get("eager_s") is None else f"{d['eager_s']:.1f}"
        harness = "-" if d.get("harness") is None else f"{d['harness']:.0%}"
        gate = d.get("gate_compiles_s") or 0.0
        less = f"{d['less_cold_s']:.1f}" + (f" ({d['less_cold_s'] - gate:.1f})" if gate else "")
        lines.append(
            f"| {r['model']} | {q['wall_s']:.1f} | {d['wall_s']:.1f} | {less} | "
            f"{eager} | {harness} | `{q['pick']}` | `{d['pick']}` | {verdict(r['compare'])} |"
        )
    done = [r for r in rows if "error" not in r["quick"] and "error" not in r["default"]]
    if done:
        lines += ["", f"Default less cold compiles, all models together: "
                  f"{sum(r['default']['less_cold_s'] for r in done):.1f} s; quick, all "
                  f"together: {sum(r['quick']['wall_s'] for r in done):.1f} s."]  # fmt: skip
    for r in done:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r["default"]["stage_s"].items())
        lines += ["", f"{r['model']}, default, seconds by stage: {parts}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cpu = [m.name for m in MODELS if not m.cuda_only]
    ap.add_argument("--models", nargs="+", default=cpu, help="zoo names (default: the CPU ones)")
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=6, help="fresh re-time: rounds of 0.5 s")
    ap.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    ap.add_argument("--out", help="markdown file (the raw rows beside it, .json)")
    args = ap.parse_args()
    args.budget = None  # effort_levels.advise reads it: each level's own budget
    paths = {m.name: m.path for m in MODELS}
    unknown = [m for m in args.models if m not in paths]
    if unknown:
        ap.error(f"not in the zoo: {', '.join(unknown)} (benchmarks/zoo.py --list)")
    machine = _environment_line(args.device)
    rows: list[dict[str, Any]] = []

    def write() -> str:
        text = report(rows, machine)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text)
            raw = {"machine": machine, "argv": sys.argv[1:], "rows": rows}
            Path(args.out).with_suffix(".json").write_text(json.dumps(raw, indent=1))
        return text

    with tempfile.TemporaryDirectory() as tmp:
        # Each run's config and trials table are kept beside --out (a pick is read afterwards
        # from what the run measured, not guessed at), else in a folder gone at the end.
        runs = Path(args.out).with_suffix("") if args.out else Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            cfg = runs / f"{name}_default.json"
            print(f"{name}: quick ...", flush=True)
            quick = advise(paths[name], args, "quick", keep=runs / f"{name}_quick.json")
            print(f"  {quick['wall_s']:.1f} s; default ...", flush=True)
            default = advise(paths[name], args, "default", keep=cfg)
            print(f"  {default['wall_s']:.1f} s", flush=True)
            row = {"model": name, "quick": quick, "default": default}
            if "error" not in quick and "error" not in default:
                row["compare"] = compare(cfg, quick, default, args)
                print(f"  {verdict(row['compare'])}", flush=True)
            rows.append(row)
            write()
    print(write())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
