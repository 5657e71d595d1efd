"""The model zoo: published models tuned in train and infer mode, at the cost a user pays.

For each model and mode:

1. **advise**: `python -m advisor advise MODEL --mode M --device D --storage memory --out cfg.json`
   in a subprocess, with its defaults otherwise (the device's built-in space, with torch.compile
   among its candidates, every candidate in an isolated worker process, the pick's final check
   in a fresh process), timed end to end: the wall time a user waits, Python's start-up and
   imports included.
2. **re-time** in fresh processes (benchmarks/fresh_retime.py): PyTorch untouched ("plain": the
   model in a bare loop, its own process); then, in one more process and interleaved (rounds
   A B C D, D C B A, ...), PyTorch's default through `advisor.apply`, the advisor's pick,
   "everything on" (CPU: channels_last + bf16 autocast; CUDA: channels_last + fp16 autocast + TF32
   + cudnn.benchmark) and `torch.compile` by hand, the rival's baseline (the untouched model;
   mode default on a CPU, max-autotune on CUDA; empty Inductor/Triton caches and timed before
   the pick, so its compile time is a cold one, timed apart: first call, and with max-autotune
   the next two, kept out of the samples; a pick that compiles is compiled by `advisor.apply`,
   its first call recorded as `first_call_s`). Each
   variant's outputs (and gradients in train mode) are compared with the untuned fp32 model.
3. a row: the advise wall time, the pick, the speedups with 95% intervals (from both medians'
   CIs, `advisor.measure.stats.speedup`), the pick's numeric error, the pick against torch.compile; a
   note where other processes used over 10% of the CPU during the row (`advisor.measure.machine_load`)
   or the advisor's final check kept the default.

Models: on a CPU the pure-PyTorch ones in benchmarks/models/ (resnet18, mobilenet_v3_small,
monai_unet3d, relu_bn_block) and the bundled advisor/examples/*.py; on CUDA also torchvision's
ResNet-50 and MobileNetV3-Large and timm's ConvNeXt-Tiny (skipped, with the reason, where
torchvision or timm do not import). `--model-file` adds any model file.

    python benchmarks/zoo.py --device cpu --out benchmarks/results/zoo_cpu.md
    python benchmarks/zoo.py --device cuda --out benchmarks/results/zoo_cuda.md
    python benchmarks/zoo.py --quick --model-file tests/data/tiny_cnn.py --modes infer \
        --variants plain everything_on --out /tmp/zoo.md          # a smoke run, ~1 min
    python benchmarks/zoo.py --merge a.json b.json --out benchmarks/results/zoo_cuda.md

The markdown goes to --out and the raw numbers (samples included) beside it, .json; both are
rewritten after every row, so a run cut short keeps what it measured. `--merge` renders one
report from several runs' JSON files (a zoo split across 10-minute device calls).

Time: a full CPU run (6 models x 2 modes on a 2-thread CPU) takes about 1.5 to 3 hours, by
estimate (not measured: the development machine is shared): per model and mode, advise 1-8 min
(resnet18 and the MONAI UNet in train mode the longest: the per-layer stage times each conv
group alone; the compile stage adds one to two cold compiles of 7 s-2 min each, within the
600 s budget; the examples took 15-20 s without it in benchmarks/results/model_retime_cpu.md), the
re-time ~30 s (3 s of interleaved sampling per variant, plus set-up and the error checks), and
torch.compile's cold compile 10 s-2 min (CPU Inductor compiles C++; train mode compiles the
backward too: 19 s for a two-conv model here). `--variants` without compile saves 5-20 minutes;
`--quick` takes about a minute per model and mode (batch size 1, short timing, a 4-candidate
search without the per-layer stage, then one compiled candidate within a 60 s budget).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# fresh_retime sits beside this file; the repo root makes `advisor` importable uninstalled (as on
# a GPU machine that receives a copy of the tree).
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from fresh_retime import compile_variant, everything_on, retime_variants  # noqa: E402

from advisor.measure.machine_load import BUSY_SHARE, CpuUsage  # noqa: E402

MODES = ("infer", "train")
# What is re-timed. default and the pick always are: every ratio is against one of them.
VARIANTS = ("plain", "default", "pick", "everything_on", "compile")
OPTIONAL = ("plain", "everything_on", "compile")


@dataclass(frozen=True)
class ZooModel:
    name: str
    path: Path
    cuda_only: bool = False  # full-size ImageNet models: minutes per step on a small CPU


MODELS = (
    ZooModel("resnet18", HERE / "models" / "resnet18.py"),
    ZooModel("mobilenet_v3_small", HERE / "models" / "mobilenet_v3_small.py"),
    ZooModel("monai_unet3d", HERE / "models" / "monai_unet3d.py"),
    ZooModel("relu_bn_block", HERE / "models" / "relu_bn_block.py"),
    ZooModel("small_cnn", ROOT / "advisor" / "examples" / "small_cnn.py"),
    ZooModel("video_cnn", ROOT / "advisor" / "examples" / "video_cnn.py"),
    ZooModel("tv_resnet50", HERE / "models" / "tv_resnet50.py", cuda_only=True),
    ZooModel("tv_mobilenet_v3_large", HERE / "models" / "tv_mobilenet_v3_large.py", cuda_only=True),
    ZooModel("timm_convnext_tiny", HERE / "models" / "timm_convnext_tiny.py", cuda_only=True),
)


# ======================================================================== running


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, **(extra or {})}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def environment(device: str) -> dict[str, Any]:
    """The machine, read in a fresh process (this one never initialises CUDA)."""
    code = (
        "import json, os, torch, advisor; "
        f"e = advisor.current_environment({device!r}).model_dump(mode='json'); "
        "e['logical_cpus'] = os.cpu_count(); e['torch_threads'] = torch.get_num_threads(); "
        "print(json.dumps(e))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=_env()
    )
    if r.returncode != 0:
        raise SystemExit(f"cannot read the environment: {_last_line(r.stderr)}")
    env: dict[str, Any] = json.loads(r.stdout)
    from advisor.device.environment import cpu_description

    env["cpu_model"] = cpu_description()
    return env


def missing(model: ZooModel) -> str | None:
    """Why the model cannot be built here (a package it imports is missing), or None."""
    from advisor.errors import ModelFileError
    from advisor.workload.model_file import build_model

    try:
        build_model(model.path)
    except ModelFileError as e:
        text = str(e)
        if "ImportError" in text or "ModuleNotFoundError" in text:
            return text.split("raised ", 1)[-1]
    return None  # anything else: the advise fails and the row says why


def write_space(device: str, path: Path) -> str:
    """--quick: the device's built-in space with a tiny budget and short timing, no per-layer
    stage (a smoke run of the pipeline, not a tuning)."""
    from importlib import resources

    import yaml

    base = "cuda" if device.startswith("cuda") else "cpu"
    data = yaml.safe_load((resources.files("search_spaces") / f"{base}.yaml").read_text())
    data["name"] = f"{base}-zoo-quick"
    # 60 s: the eager candidates first, then one cold compile of the model (compile_stage)
    data["budget"].update(trials=4, time_s=60)
    data["timing"].update(warmup_runs=1, warmup_s=0.0, min_samples=3, max_time_s=0.05)
    data["per_layer"] = False
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def advise(model: ZooModel, mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """`advisor advise` in a subprocess, timed end to end; the pick read from its config."""
    import advisor

    cfg = work / f"{model.name}.{mode}.json"
    cmd = [sys.executable, "-m", "advisor", "advise", str(model.path), "--mode", mode]
    cmd += ["--device", args.device, "--storage", "memory", "--out", str(cfg)]
    if args.space_file:
        cmd += ["--space", args.space_file]
    if args.quick:
        cmd += ["--batch-sizes", "1"]
    if args.in_process:
        cmd += ["--in-process"]
    shown = "python -m advisor " + shlex.join(cmd[3:])
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=args.advise_timeout
        )
    except subprocess.TimeoutExpired:
        return {"command": shown, "error": f"timed out after {args.advise_timeout:.0f} s"}
    wall = time.perf_counter() - t0
    if r.returncode != 0 or not cfg.exists():
        return {"command": shown, "wall_s": wall, "error": _last_line(r.stderr or r.stdout)}
    config = advisor.load_config(cfg)
    out: dict[str, Any] = {
        "command": shown,
        "wall_s": wall,
        "config_path": str(cfg),
        "settings": config.settings.model_dump(mode="json"),
        "label": config.settings.label(),
    }
    res = config.result
    if res is not None:
        out.update(
            why=res.why,
            claimed_speedup=res.speedup,
            claimed_speedup_ci=list(res.speedup_ci),
            trials=res.trials,
            rejected=res.rejected,
            failed=res.failed,
            tuning_s=res.tuning_s,
            compile_note=res.compile_note,
            notes=res.notes,
            other_load=res.other_load,
            final_check=res.final_check.model_dump(mode="json") if res.final_check else None,
        )
    return out


def run_row(
    model: ZooModel, mode: str, args: argparse.Namespace, work: Path, cache_root: Path
) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model.name, "file": _shown_path(model.path), "mode": mode}
    usage = CpuUsage()  # other processes' share of the CPU during the row
    print(f"{model.name} ({mode}): advise ...", flush=True)
    adv = advise(model, mode, args, work)
    row["advise"] = adv
    if "error" in adv:
        print(f"  advise failed: {adv['error']}", flush=True)
        return row
    print(f"  advise: {adv['label']} in {adv['wall_s']:.1f} s; re-time ...", flush=True)
    variants: dict[str, dict[str, Any]] = {"default": {}, "pick": adv["settings"]}
    if "everything_on" in args.variants:
        variants["everything_on"] = everything_on(args.device)
    if "compile" in args.variants:
        variants["compile"] = compile_variant(args.device)
    caches = cache_root / f"{model.name}.{mode}"  # empty: a cold compile
    env = {"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TRITON_CACHE_DIR": str(caches / "triton")}  # fmt: skip
    t0 = time.perf_counter()
    try:
        row["retime"] = retime_variants(
            Path(adv["config_path"]),
            variants,
            mode,
            args.device,
            rounds=args.rounds,
            min_run_time_s=args.min_run_time,
            plain="plain" in args.variants,
            timeout_s=args.retime_timeout,
            env=env,
        )
    except RuntimeError as e:
        row["retime_error"] = str(e)
        print(f"  re-time failed: {e}", flush=True)
        return row
    row["retime_s"] = time.perf_counter() - t0
    row["other_cpu_share"] = usage.others_share()
    print("  " + _summary(row), flush=True)
    return row


def _shown_path(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(ROOT))
    return str(path)


# ======================================================================== the report


def _measurement(v: dict[str, Any] | None) -> Any:
    from advisor.measure.stats import Measurement

    if not v or not v.get("samples_ms"):
        return None
    return Measurement(samples_ms=v["samples_ms"])


def speedup_of(base: dict[str, Any] | None, other: dict[str, Any] | None) -> list[float] | None:
    """base time / other time with its 95% interval: above 1, `other` is faster."""
    from advisor.measure.stats import speedup

    b, o = _measurement(base), _measurement(other)
    if b is None or o is None:
        return None
    return list(speedup(b, o))


def _x(s: list[float] | None) -> str:
    if s is None:
        return "-"
    mid, lo, hi = s
    return f"{mid:.2f}x [{lo:.2f}-{hi:.2f}]"


def ratios(row: dict[str, Any]) -> dict[str, list[float] | None]:
    t = row.get("retime", {})
    ok = {k: v for k, v in t.items() if "error" not in v}
    return {
        "pick_vs_plain": speedup_of(ok.get("plain"), ok.get("pick")),
        "pick_vs_default": speedup_of(ok.get("default"), ok.get("pick")),
        "everything_on_vs_default": speedup_of(ok.get("default"), ok.get("everything_on")),
        "compile_vs_default": speedup_of(ok.get("default"), ok.get("compile")),
        "pick_vs_compile": speedup_of(ok.get("compile"), ok.get("pick")),
    }


def _summary(row: dict[str, Any]) -> str:
    r = ratios(row)
    return "; ".join(f"{k.replace('_', ' ')} {_x(v)}" for k, v in r.items() if v is not None)


def _ms(v: dict[str, Any] | None) -> str:
    return f"{v['median_ms']:.3g}" if v and "median_ms" in v else "-"


HEADER = (
    "| model | mode | advise s | pick | default ms | pick ms | pick vs plain | pick vs default "
    "| advise's own estimate | everything on vs default | compile vs default | compile s "
    "| pick error (out / grad) | pick vs compile |"
)
COLUMNS = [c.strip() for c in HEADER.strip("|").split("|")]


def render(data: dict[str, Any]) -> str:
    env, opts = data["environment"], data["options"]
    cuda = env.get("device_type") == "cuda"
    machine = (
        f"CPU {env.get('cpu_model')}, {env.get('torch_threads')} torch threads "
        f"({env.get('logical_cpus')} logical CPUs); torch {env.get('torch')}; "
        f"Python {env.get('python')}; {env.get('platform')}"
    )
    if cuda:
        machine += (
            f"; GPU {env.get('device_name')} (capability {env.get('capability')}, "
            f"{env.get('device_memory_gb')} GB), driver {env.get('driver')}, CUDA {env.get('cuda')}, "
            f"cuDNN {env.get('cudnn')}, triton {env.get('triton')}"
        )
    eo = ", ".join(f"{k}={v}" for k, v in everything_on(env.get("device_type", "cpu")).items())
    lines = [
        f"# Model zoo: the advisor on published models ({env.get('device_type')})",
        "",
        f"Machine: {machine}; fingerprint {env.get('fingerprint')}.",
        f"Date: {data.get('date', '-')}.",
        f"Command: `{data['command']}`",
        "",
        "How: `advise s` is the wall time of `python -m advisor advise MODEL --mode M --device D "
        "--storage memory` in a subprocess (Python start-up, imports, the search with every "
        "candidate in an isolated worker, the numeric gate, the per-layer stage where the space "
        f"has one; space `{opts.get('space') or 'the built-in one'}`"
        f"{', batch size 1, a 4-candidate search' if opts.get('quick') else ''}). Then each "
        "variant is set up with `advisor.apply` and re-timed in a fresh process, interleaved "
        f"({opts['rounds']} x {opts['min_run_time']} s of rounds A B C D, D C B A, ...; "
        "benchmarks/fresh_retime.py): PyTorch's default, the pick, everything on "
        f"({eo}) and torch.compile (mode {compile_variant(env.get('device_type', 'cpu'))['compile']!r}"
        ", the untouched model; compile s = its first call with empty compile caches, kept out of "
        "the samples). Plain = the untouched model in a bare loop in its own fresh process, "
        "without `advisor.apply` (which on a CPU also settles glibc malloc). Speedups are "
        "baseline time / time, above 1.00x faster, with a 95% interval from both medians' CIs "
        "(`advisor.measure.stats.speedup`); `advise's own estimate` is the pick vs default the advisor "
        "measured during its search. Errors: outputs / parameter gradients relative to the "
        "untuned fp32 model.",
        "",
        HEADER,
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    notes = []
    for row in data["rows"]:
        head = f"| {row['model']} | {row['mode']} |"
        if row.get("skipped"):
            lines.append(f"{head} - | skipped: {row['skipped']} | | | | | | | | | | |")
            continue
        adv = row.get("advise", {})
        wall = f"{adv['wall_s']:.1f}" if "wall_s" in adv else "-"
        if "error" in adv:
            lines.append(f"{head} {wall} | advise failed: {adv['error']} | | | | | | | | | | |")
            continue
        claimed = "-"
        if adv.get("claimed_speedup") is not None:
            lo, hi = adv["claimed_speedup_ci"]
            claimed = f"{adv['claimed_speedup']:.2f}x [{lo:.2f}-{hi:.2f}]"
        t = row.get("retime", {})
        if row.get("retime_error"):
            notes.append(f"- {row['model']} {row['mode']}: re-time failed: {row['retime_error']}")
        for name, v in t.items():
            if "error" in v:
                notes.append(f"- {row['model']} {row['mode']}: {name} failed: {v['error']}")
        check = adv.get("final_check")
        if check and not check.get("held"):
            lo, hi = check["speedup_ci"]
            notes.append(
                f"- {row['model']} {row['mode']}: the advisor's final check ({check['where']}) "
                f"found {check['speedup']:.2f}x [{lo:.2f}-{hi:.2f}]: it kept PyTorch's default"
            )
        others = row.get("other_cpu_share")
        if others is not None and others > BUSY_SHARE:
            notes.append(
                f"- {row['model']} {row['mode']}: other processes used {others:.0%} of the "
                "machine's CPU time during this row: its timings are noisy"
            )
        r = ratios(row)
        comp = t.get("compile", {})
        slower = _compile_break_even(row, r["pick_vs_compile"])
        if slower:
            notes.append(f"- {row['model']} {row['mode']}: {slower}")
        compile_s = f"{comp['compile_s']:.1f}" if "compile_s" in comp else "-"
        if "compile" not in t:
            compile_s = "-"
        elif "error" in comp:
            compile_s = "failed"
        pick = t.get("pick", {})
        err = "-"
        if "err" in pick:
            grad = f"{pick['grad_err']:.1e}" if pick.get("grad_err") is not None else "-"
            err = f"{pick['err']:.1e} / {grad}"
        label = f"`{adv['label']}`"
        if pick.get("layers"):
            label += f" ({len(pick['layers'])} layers swapped)"
        same = [n for n in ("default", "everything_on") if adv["settings"] == _settings(n, env)]
        if same:  # two copies of the same settings, timed interleaved: their ratio is the noise
            label += f" (= {same[0].replace('_', ' ')}: that ratio shows the noise)"
        lines.append(
            f"{head} {wall} | {label} | {_ms(t.get('default'))} | {_ms(pick)} "
            f"| {_x(r['pick_vs_plain'])} | {_x(r['pick_vs_default'])} | {claimed} "
            f"| {_x(r['everything_on_vs_default'])} | {_x(r['compile_vs_default'])} | {compile_s} "
            f"| {err} | {_x(r['pick_vs_compile'])} |"
        )
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def _compile_break_even(row: dict[str, Any], pick_vs_compile: Any) -> str | None:
    """Where torch.compile on the untouched model ran faster than the pick beyond noise: after
    how many steps its cold compile pays that back, and what the advisor said of compile (it
    bills a cold compile over the run's steps, 10,000 by default); None otherwise."""
    t = row.get("retime", {})
    comp, pick = t.get("compile", {}), t.get("pick", {})
    if pick_vs_compile is None or "median_ms" not in comp or "median_ms" not in pick:
        return None
    if pick_vs_compile[2] >= 1.0:  # the interval reaches 1: as fast, within noise
        return None
    saved_ms = pick["median_ms"] - comp["median_ms"]
    line = (f"torch.compile ran faster than the pick ({comp['median_ms']:.3g} against "
            f"{pick['median_ms']:.3g} ms a step)")  # fmt: skip
    if saved_ms > 0 and comp.get("compile_s"):
        line += (f"; its cold compile ({comp['compile_s']:.1f} s) pays that back after "
                 f"{comp['compile_s'] * 1e3 / saved_ms:,.0f} steps")  # fmt: skip
    said = row.get("advise", {}).get("compile_note")
    return line + (f". The advisor: {said}" if said else "")


def _settings(variant: str, env: dict[str, Any]) -> dict[str, Any]:
    """A variant's full settings, as a config file writes them."""
    from advisor.knobs import Settings

    given = everything_on(env.get("device_type", "cpu")) if variant == "everything_on" else {}
    return Settings.model_validate(given).model_dump(mode="json")


def write_outputs(data: dict[str, Any], out: Path | None) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data))
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))


# ======================================================================== command line


def merged_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model and mode, in first-seen order: a later part's row replaces an earlier
    one that was skipped or failed (a model re-run once its package was installed); a row that
    was measured is kept over a later one that was not."""
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["model"], row["mode"])
        if key not in kept or not _measured(kept[key]):
            kept[key] = row
    return list(kept.values())


def _measured(row: dict[str, Any]) -> bool:
    return not row.get("skipped") and "error" not in row.get("advise", {})


def merge(paths: list[str], out: Path | None) -> int:
    """One report from several runs' JSON files: their rows in order, the first one's machine."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    prints = {p["environment"].get("fingerprint") for p in parts}
    if len(prints) > 1:
        print(f"warning: the parts come from {len(prints)} environments", file=sys.stderr)
    data = {**parts[0], "rows": merged_rows([r for p in parts for r in p["rows"]])}
    data["command"] = " && ".join(dict.fromkeys(p["command"] for p in parts))
    write_outputs(data, out)
    print(render(data), flush=True)
    return 0


def select_models(args: argparse.Namespace) -> list[ZooModel]:
    cuda = args.device.startswith("cuda")
    chosen: list[ZooModel] = []
    if args.models:
        unknown = [p for p in args.models if not any(fnmatch.fnmatch(m.name, p) for m in MODELS)]
        if unknown:
            names = ", ".join(m.name for m in MODELS)
            raise SystemExit(f"no model matches {', '.join(unknown)}; models: {names}")
        chosen = [m for m in MODELS if any(fnmatch.fnmatch(m.name, p) for p in args.models)]
    elif not args.model_file:
        chosen = [m for m in MODELS if cuda or not m.cuda_only]
    for f in args.model_file or []:
        path = Path(f).resolve()
        if not path.is_file():
            raise SystemExit(f"model file not found: {f}")
        chosen.append(ZooModel(path.stem, path))
    return chosen


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    ap.add_argument("--models", nargs="+", metavar="NAME", help="zoo names or globs ('tv_*')")
    ap.add_argument(
        "--model-file", action="append", metavar="PATH", help="a model file to add (repeatable)"
    )
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="what to re-time besides PyTorch's default and the pick (always): plain, "
        "everything_on, compile (default: all)",
    )
    ap.add_argument("--quick", action="store_true", help="batch size 1, short timing: a smoke run")
    ap.add_argument("--space", help="the advisor's search space (default: the device's built-in)")
    ap.add_argument("--in-process", action="store_true", help="advise without worker processes")
    ap.add_argument("--rounds", type=int, help="re-time: budget = rounds x --min-run-time")
    ap.add_argument("--min-run-time", type=float, help="re-time: seconds per round and variant")
    ap.add_argument("--advise-timeout", type=float, default=3600.0)
    ap.add_argument("--retime-timeout", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, help="markdown file (and the raw numbers beside it, .json)")
    ap.add_argument("--list", action="store_true", help="list the zoo's models and exit")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="one report from several runs")
    args = ap.parse_args(argv)
    args.variants = [v for v in VARIANTS if v in {*args.variants, "default", "pick"}]
    if args.rounds is None:
        args.rounds = 4 if args.quick else 6
    if args.min_run_time is None:
        args.min_run_time = 0.05 if args.quick else 0.5
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.list:
        for m in MODELS:
            print(f"{m.name:24} {_shown_path(m.path)}{'  (CUDA only)' if m.cuda_only else ''}")
        return 0
    models = select_models(args)
    env = environment(args.device)
    data: dict[str, Any] = {
        "command": "python benchmarks/zoo.py " + shlex.join(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "options": {
            "device": args.device,
            "modes": args.modes,
            "variants": args.variants,
            "quick": args.quick,
            "space": args.space,
            "in_process": args.in_process,
            "rounds": args.rounds,
            "min_run_time": args.min_run_time,
        },
        "rows": [],
    }
    print(f"{env['cpu_model']} | {env['device_name']} | torch {env['torch']}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        work = Path(tmp)
        args.space_file = args.space
        if args.quick and not args.space:
            args.space_file = write_space(args.device, work / "space.yaml")
        for model in models:
            why = missing(model)
            for mode in args.modes:
                if why:
                    row = {"model": model.name, "file": _shown_path(model.path), "mode": mode,
                           "skipped": why}  # fmt: skip
                    print(f"{model.name} ({mode}): skipped: {why}", flush=True)
                else:
                    row = run_row(model, mode, args, work, work / "caches")
                data["rows"].append(row)
                write_outputs(data, args.out)  # after every row: a run cut short keeps its rows
    data["total_s"] = time.perf_counter() - start
    write_outputs(data, args.out)
    print("\n" + render(data), flush=True)
    print(f"total {data['total_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
