"""Studies of the advisor's measurement: the numeric gate's, and the profiles of a run.

    python -m benchmarks gates verdicts [models...] [--seeds 5] [--space cpu] [--out FILE]
    python -m benchmarks gates check-cost [models...] [--seeds 3] [--out FILE]
    python -m benchmarks gates held-out MODEL [--lr 1e-4] [--steps 16,32] [--amp bf16]
    python -m benchmarks profile DIR [--top N] [--out FILE]

- `verdicts`: for each model and input seed, the gate (`advisor.gate.numeric.Gate`, as `advisor
  advise` builds it from a space) judges exact-fp32 channels_last, bf16 autocast, bf16 +
  channels_last, oneDNN's bf16 fp32 convs and two conv implementations that are wrong on purpose
  (weights off by 1e-3; a kernel tap dropped: tests/plugins/faulty_impls.py), with the training
  check behind the bf16 column (the rate kept, fp32's loss, bf16's gap against 1% of what fp32
  learnt and the band). Then the check's controls: two negative ones (tests/data/below_bf16.py
  in bf16, fp16_overflow.py in fp16) that must be rejected on every draw, and two positive ones
  (bottleneck_resnet.py, deep_bottleneck_resnet.py in bf16) that must be accepted. A verdict
  that changes with the seed is the lottery the gate exists to remove.
- `check-cost`: the training check's fp32 side (`advisor.gate.precision.fp32_runs`: the rate
  probe, the reference, the band's runs) with every band run switched on, timed; which run set
  the band (one that never does is time the check can save). Run it alone: it times.
- `held-out`: a precision's gap to fp32 in the check's task, on the batches it trained on and
  on held-out batches (advisor/gate/held_out.py), at several horizons.
- `profile`: tables of the profiles a run left in `$ADVISOR_PROFILE_DIR`
  (advisor/execute/profiling.py): one of all processes, then per process the top functions by
  cumulative and own time and own time by library. cProfile slows Python-heavy code: read
  shares, not benchmark figures.

The studies print markdown (and write it to `--out`); their verdicts are not the table's
figures. The models are registry names (benchmarks/registry.py) or model files.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import pstats
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from benchmarks.registry import BY_NAME, ROOT, SETS, UsageError

DATA = ROOT / "tests" / "data"
VERDICT_MODELS = ("small_cnn", "video_cnn", "relu_bn_block", "resnet18", "mobilenet_v3_small",
                  "monai_unet3d")  # fmt: skip


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _parser(prog: str) -> argparse.ArgumentParser:
    return _Parser(prog=f"benchmarks {prog}")


def _model_path(name: str) -> Path:
    """A registry model's file (its own `build_model`), or a model file; UsageError else."""
    if name in BY_NAME and BY_NAME[name].build is None:
        return BY_NAME[name].path
    path = Path(name)
    if path.suffix == ".py" and path.is_file():
        return path.resolve()
    raise UsageError(f"unknown model {name!r} (a registry model with its own build_model, or "
                     "a model file)")


def gates(study: str, argv: list[str]) -> int:
    """`python -m benchmarks gates STUDY ...`."""
    return {"verdicts": verdicts, "check-cost": check_cost, "held-out": held_out}[study](argv)


# ======================================================================== gates verdicts


def _verdict_cases() -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The training check's controls (model file, the precision, whether it must be accepted),
    the candidates judged, and the minimal timing (only the verdicts matter)."""
    from advisor.knobs import Settings
    from advisor.measure.stopping import TimingPolicy

    # Controls of the training check: (model file, the precision, whether it must be accepted).
    CONTROLS = {
        "below_bf16": (DATA / "below_bf16.py", Settings(amp="bf16"), False),
        "fp16_overflow": (DATA / "fp16_overflow.py", Settings(amp="fp16"), False),
        "bottleneck_resnet": (
            DATA / "bottleneck_resnet.py",
            Settings(amp="bf16"),
            True,
        ),
        # ResNet-50's depth: learns the check's batches nearly to nothing, bf16 trailing there
        "deep_bottleneck_resnet": (
            DATA / "deep_bottleneck_resnet.py",
            Settings(amp="bf16"),
            True,
        ),
    }
    CANDIDATES = {
        "channels_last": Settings(memory_format="channels_last"),
        "bf16": Settings(amp="bf16"),
        "bf16+channels_last": Settings(amp="bf16", memory_format="channels_last"),
        "bf16 fp32 convs": Settings(cpu_fp32="bf16"),
        "weights x1.001": Settings(conv_impl="test_scaled"),
        "tap dropped": Settings(conv_impl="test_tap"),
    }
    QUICK = TimingPolicy(warmup_runs=0, warmup_s=0.0, min_samples=3, max_samples=3, max_time_s=0.0)
    return CONTROLS, CANDIDATES, QUICK


def _verdict_check(r) -> str:  # noqa: ANN001 - a TrialResult
    """The training (or output) check that judged the result's precision: fp32's loss from the
    start to the end at the rate kept, the precision's final gap over the start against 1% of
    what fp32 learnt (the floor) and the band where it was run, the runs' length where they were
    trained longer; or not judged, and why."""
    c = r.precision_check
    if c is None:
        return "-"
    if c.mode == "infer":
        verdict = "accepted" if c.accepted else "**rejected**"
        return f"{verdict}: error {c.gap:.1e} vs {c.band:g}, {c.seconds:.0f} s"
    # fp32's run as long as the one judged (the check trains both again for a lag to settle)
    ref = c.losses.get(f"fp32, {c.steps} steps", c.losses.get("fp32", []))
    learnt = f"lr {c.lr:g}, fp32 {c.start:.3g} -> {ref[-1]:.3g}" if ref else "fp32 -"
    if not c.judged:
        why = ("fp32 did not learn" if "did not learn" in c.summary else
               "below its resolution" if "half-ulp" in c.summary else "band too wide")  # fmt: skip
        return f"**not judged** ({why}): {learnt}, band {c.band:.2%}, {c.seconds:.0f} s"
    verdict = "accepted" if c.accepted else "**rejected**"
    longer = f", at {c.steps} steps" if c.steps and c.steps != 16 else ""
    if math.isnan(c.band):  # within the floor: the band's run was not needed, nor made
        return (f"{verdict}: {learnt}, gap {c.gap:.2%} vs floor {c.floor:.2%} (band not run)"
                f"{longer}, {c.seconds:.0f} s")  # fmt: skip
    held = c.held_out
    looked = (f"; held-out gap {held['gap']:.2%} vs {held['allowance']:.2%} (fp32 learnt "
              f"{held['learnt']:.0%} there)" if held else "")  # fmt: skip
    return (f"{verdict}: {learnt}, gap {c.gap:.2%} vs floor {c.floor:.2%}, band {c.band:.2%}"
            f"{longer}{looked}, {c.seconds:.0f} s")  # fmt: skip


def _verdict_cell(r) -> str:  # noqa: ANN001 - a TrialResult
    if r.status == "ok":
        grad = f", grad {r.grad_error:.1e} <= {r.grad_tolerance:.1e}" if r.grad_error else ""
        return f"ok (out {r.rel_error:.1e}{grad})"
    if r.status == "rejected" and r.rejection == "not_finite":  # no training check needed
        return "**rejected**: NaN or Inf in its outputs or gradients"
    if r.status == "rejected":
        c = r.precision_check
        if c is not None and not c.judged:
            return "**rejected**: not judged by its training check"
        by = (r.rejected_by or "").split("=")[0] or "its training check (Inf or NaN)"
        return f"**rejected** by {by}"
    return f"failed: {r.reason}"


def verdicts(argv: list[str]) -> int:
    """`gates verdicts`: the gate's verdicts over input draws (the module's docstring)."""
    p = _parser("gates verdicts")
    p.add_argument("models", nargs="*", default=list(VERDICT_MODELS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--space", default="cpu")
    p.add_argument("--mode", default="train", choices=["train", "infer"])
    p.add_argument("--out", help="also write the markdown here")
    p.add_argument("--no-controls", dest="controls", action="store_false",
                   help="leave out the training check's negative controls")  # fmt: skip
    args = p.parse_args(argv)
    import torch

    from advisor.execute.runner import Gate, evaluate
    from advisor.space import load_space
    from advisor.workload.build import model_workload
    from benchmarks.table import cpu_description
    from tests.plugins import faulty_impls  # registers test_scaled and test_tap

    CONTROLS, CANDIDATES, QUICK = _verdict_cases()

    faulty_impls.register_all()
    cpu = torch.device("cpu")
    space = load_space(args.space, cpu)
    lines = [
        "# Numeric-gate verdicts over input draws",
        "",
        f"Machine: {cpu_description()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; space `{space.name}`, mode {args.mode}.",
        f"Command: `python -m benchmarks gates verdicts {' '.join(argv)}`",
        "",
    ]
    for name in args.models:
        path = _model_path(name)
        try:
            w = model_workload(str(path))
        except Exception as e:  # noqa: BLE001 - e.g. monai not installed
            lines += [f"## {name}", "", f"skipped: {e}", ""]
            continue
        lines += [f"## {name}", "", "| seed | " + " | ".join(CANDIDATES) + " | bf16 check |"]
        lines.append("|---" * (len(CANDIDATES) + 2) + "|")
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            gate = Gate(w, cpu, args.mode, space, seed=seed)
            results = {k: evaluate(w, s, cpu, args.mode, space, gate, policy=QUICK)
                       for k, s in CANDIDATES.items()}  # fmt: skip
            cells = [_verdict_cell(r) for r in results.values()] + [_verdict_check(results["bf16"])]
            onednn = results["bf16 fp32 convs"].precision_check
            if onednn is not None and onednn.judged:  # judged against the same fp32 runs as bf16
                cells[-1] += f"; fp32 convs gap {onednn.gap:.2%}"
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
            print(f"{name} seed {seed}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        lines.append("")
    if args.controls:
        lines += ["## Controls of the training check", "",
                  "| model | precision | must be | seed | verdict | check |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for name, (path, settings, good) in CONTROLS.items():
            w = model_workload(str(path))
            for seed in range(args.seeds):
                gate = Gate(w, cpu, args.mode, space, seed=seed)
                r = evaluate(w, settings, cpu, args.mode, space, gate, policy=QUICK)
                must = "accepted" if good else "rejected"
                lines.append(f"| {name} | {settings.amp} | {must} | {seed} | {_verdict_cell(r)} | "
                             f"{_verdict_check(r)} |")  # fmt: skip
                print(f"{name} seed {seed}: {r.status}", file=sys.stderr)
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0

# ======================================================================== gates check-cost


def _cost_row(name: str, seed: int, seconds: float, lr: float, gaps: dict[str, float]) -> str:
    widest = max(gaps, key=lambda k: gaps[k]) if gaps else "-"
    cells = " | ".join(f"{v:.3%}" for v in gaps.values())
    return f"| {name} | {seed} | {seconds:.1f} | {lr:g} | {cells} | {widest} |"


def check_cost(argv: list[str]) -> int:
    """`gates check-cost`: what the training check's fp32 side costs, and which of its runs
    sets the band (the module's docstring)."""
    import torch

    from advisor.device.environment import current_environment
    from advisor.gate.precision import final_gap, fp32_runs
    from advisor.space import load_space
    from advisor.workload.build import model_workload

    ap = _parser("gates check-cost")
    ap.add_argument("models", nargs="*", default=[n for n in SETS["zoo"]])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--space", default="cpu")
    ap.add_argument("--jitter-runs", type=int, default=1)
    ap.add_argument("--batch-runs", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    known = {name: _model_path(name) for name in args.models}
    cpu = torch.device("cpu")
    space = load_space(args.space, cpu)
    cfg = space.precision_check.model_copy(
        update={"jitter_runs": args.jitter_runs, "batch_runs": args.batch_runs}
    )
    env = current_environment(cpu)
    band_runs = [f"fp32 jittered {j + 1}" for j in range(cfg.jitter_runs)] + [
        f"fp32 other batches {k + 1}" for k in range(cfg.batch_runs)
    ]
    lines = [
        "# The training check's fp32 side: its cost, and which run sets the band",
        "",
        f"Machine: {env.device_name} ({env.capability}), {torch.get_num_threads()} threads; "
        f"torch {torch.__version__}"
        f"; Python {sys.version.split()[0]}.",
        f"Command: `python -m benchmarks gates check-cost {' '.join(argv)}`",
        f"Check settings: {cfg.steps} steps, {cfg.batches} batches, lr from {cfg.lr:g}.",
        "",
        "| model | seed | fp32 side s | lr kept | " + " | ".join(band_runs) + " | sets the band |",
        "|---|---:|---:|---:|" + "---:|" * len(band_runs) + "---|",
    ]
    for name in args.models:
        try:
            w = model_workload(str(known[name]))
        except Exception as e:  # noqa: BLE001 - e.g. monai not installed
            lines.append(f"| {name} | skipped: {e} |")
            continue
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            side = fp32_runs(w, cpu, "train", cfg, seed)
            seconds = time.perf_counter() - t0
            ref = side.runs["fp32"]
            gaps = {k: abs(final_gap(side.runs[k], ref, side.starts.get(k, side.start), side.start))
                    for k in band_runs}  # fmt: skip
            lines.append(_cost_row(name, seed, seconds, side.cfg.lr, gaps))
            print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0

# ======================================================================== gates held-out


def _task(workload, cfg, first_seed: int, seed: int):  # noqa: ANN001, ANN202
    import torch

    from advisor.gate import training

    CPU = torch.device("cpu")
    batches = training.batches_of(workload, cfg.batches, first_seed + 100 * seed)
    targets = training.targets_of(workload, batches, CPU, "train", cfg, seed)
    return batches, targets, training.start_loss(workload, CPU, batches, targets)


def _held_out_row(workload, amp: str, cfg, seed: int) -> str:  # noqa: ANN001
    import torch

    from advisor.gate import training
    from advisor.knobs import Settings

    CPU = torch.device("cpu")
    t0 = time.perf_counter()
    task, held, other = (_task(workload, cfg, s, seed) for s in (1000, 9000, 5000))

    def run(settings: Settings, on: tuple) -> tuple[float, float]:
        kept: list[training.Weights] = []
        losses = training.train(workload, settings, CPU, on[0], on[1], cfg, keep=kept)
        ho = training.judged_weights(workload, kept[0], CPU, held[0], held[1]) / held[2]
        return losses[-1] / on[2], ho

    f_own, f_ho = run(training.REFERENCE, task)
    p_own, p_ho = run(Settings(amp=amp), task)
    o_own, o_ho = run(training.REFERENCE, other)
    cells = [seed, cfg.lr, cfg.steps, f"{f_own:.4f}", f"{p_own:.4f}", f"{p_own - f_own:+.2%}",
             f"{abs(o_own - f_own):.2%}", f"{1 - f_ho:.1%}", f"{p_ho - f_ho:+.2%}",
             f"{abs(o_ho - f_ho):.2%}", f"{time.perf_counter() - t0:.0f}"]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def held_out(argv: list[str]) -> int:
    """`gates held-out`: a precision's gap to fp32 on the check's batches and on held-out
    batches (the module's docstring)."""
    import torch

    from advisor.gate.reference_runs import fp32_runs
    from advisor.measure.verdict import PrecisionCheckSettings
    from advisor.workload.build import model_workload

    p = _parser("gates held-out")
    p.add_argument("model", help="a registry name or a model file")
    p.add_argument("--lr", type=float, help="Adam's rate (default: the one the check keeps)")
    p.add_argument("--steps", default="16,32")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--amp", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--out")
    args = p.parse_args(argv)
    workload = model_workload(str(_model_path(args.model)))
    lines = [
        f"# Training-batch and held-out gaps: {Path(args.model).name}, {args.amp}",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}. Command: `python -m benchmarks gates held-out "
        f"{' '.join(argv)}`",
        "",
        "Losses over each set's start. Train: the check's batches (fp32's end, the precision's, "
        "its gap, fp32's band on other batches). Held-out: fp32's drop there, the precision's gap, "
        "and fp32 trained on the other batches from fp32 (the held-out band).",
        "",
        "| seed | lr | steps | fp32 end | precision end | train gap | train band | held-out "
        "learnt | held-out gap | held-out band | s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for seed in range(args.seeds):
        base = PrecisionCheckSettings()
        lr = args.lr or fp32_runs(workload, torch.device("cpu"), "train", base, seed,
                                  band=False).cfg.lr
        for steps in (int(s) for s in args.steps.split(",")):
            row = _held_out_row(workload, args.amp, base.model_copy(update={"lr": lr, "steps": steps}), seed)
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0

# ======================================================================== profile


Key = tuple[str, int, str]  # pstats' function key: file, line, name


@dataclass
class Profile:
    """One process's profile: its role, pid, sidecar and pstats' table."""

    path: Path
    role: str
    pid: int
    meta: dict[str, Any] = field(default_factory=dict)
    stats: dict[Key, tuple[Any, ...]] = field(default_factory=dict)
    total_s: float = 0.0  # own time summed: the seconds the profile saw

    @property
    def covered_s(self) -> float:
        return float(self.meta.get("covered_s") or self.total_s)


def load(folder: Path) -> list[Profile]:
    """Every profile in `folder`, the advisor command's first, then by role and pid."""
    found = []
    for path in sorted(folder.glob("*.prof")):
        role, _, pid = path.stem.rpartition("-")
        side = path.with_suffix(".json")
        meta = json.loads(side.read_text()) if side.exists() else {}
        st = pstats.Stats(str(path))
        table: dict[Key, tuple[Any, ...]] = st.stats  # type: ignore[attr-defined]
        found.append(Profile(path, meta.get("role", role or path.stem),
                             int(meta.get("pid", pid if pid.isdigit() else 0)), meta, table,
                             float(st.total_tt)))  # type: ignore[attr-defined]  # fmt: skip
    return sorted(found, key=lambda p: (p.role != "advisor", p.role, p.pid))


def where(key: Key) -> str:
    """A function as a short, readable name: `torch/__init__.py:12(<module>)`, or a builtin's."""
    file, line, name = key
    if file == "~":  # a C function: pstats names it in full
        return name
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    else:
        if file.startswith(str(ROOT) + "/"):
            file = file[len(str(ROOT)) + 1 :]
        elif "/lib/python" in file:  # the standard library
            file = file.split("/lib/python", 1)[1].partition("/")[2]
    return f"{file}:{line}({name})"


# C functions by what they do: a parent's waits on its children, an import's loading, torch's ops
WAITS = ("poll", "select", "sleep", "waitpid", "posix.read", "acquire", "recv", "_wait")
IMPORTS = ("_imp.", "marshal.loads", "posix.stat", "posix.lstat", "posix.listdir", "io.open_code")


def library(key: Key) -> str:
    """What a function belongs to: a package (its top folder), the advisor, the standard
    library, Python's import system, or a C function by what it does (waiting, loading an
    import, a torch op)."""
    file, _, name = key
    if file == "~":
        if any(w in name for w in WAITS):
            return "waiting (poll, sleep, locks, pipes: C)"
        if any(w in name for w in IMPORTS):
            return "Python (imports)"
        return "torch (C: ops, autograd)" if "torch" in name else "C builtins (other)"
    if file.startswith("<frozen"):
        return "Python (imports)"
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    if file.startswith(str(ROOT / "advisor")):
        return "advisor"
    if file.startswith(str(ROOT)):
        return file[len(str(ROOT)) + 1 :].split("/", 1)[0]
    if "/lib/python" in file:
        return "Python (standard library)"
    return "other"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _s(value: float) -> str:
    return f"{value:.3f}"


def processes_table(profiles: list[Profile]) -> list[str]:
    """One row per process; the age at start is what its profile could not see (the
    interpreter's start; for a spawned child, torch's import too)."""
    lines = ["| process | pid | started after (s) | covered (s) | profiled (s) | ended |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for p in profiles:
        age = p.meta.get("age_at_start_s")
        lines.append(f"| {p.role} | {p.pid} | {'?' if age is None else f'{age:.2f}'} | "
                     f"{_s(p.covered_s)} | {_s(p.total_s)} | {p.meta.get('ended', '?')} |")  # fmt: skip
    total = sum(p.covered_s for p in profiles)
    lines.append(f"| all ({len(profiles)} processes) | | | {_s(total)} | "
                 f"{_s(sum(p.total_s for p in profiles))} | |")  # fmt: skip
    return lines


def top_table(p: Profile, top: int, by: str) -> list[str]:
    """The `top` functions by cumulative ("cum") or own ("own") time."""
    col = 3 if by == "cum" else 2
    rows = sorted(p.stats.items(), key=lambda kv: kv[1][col], reverse=True)[:top]
    base = p.total_s or 1.0
    first = "cumulative (s)" if by == "cum" else "own (s)"
    other = "own (s)" if by == "cum" else "cumulative (s)"
    lines = [
        f"| {first} | share | {other} | calls | function |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for key, (cc, nc, tt, ct, _) in rows:
        main, rest = (ct, tt) if by == "cum" else (tt, ct)
        calls = f"{nc}" if nc == cc else f"{nc}/{cc}"
        lines.append(f"| {_s(main)} | {main / base:.0%} | {_s(rest)} | {calls} | "
                     f"`{_cell(where(key))}` |")  # fmt: skip
    return lines


def library_table(p: Profile, top: int) -> list[str]:
    """Own time summed by library (`library`): where the process's seconds were spent."""
    own: dict[str, float] = {}
    for key, (_, _, tt, _, _) in p.stats.items():
        own[library(key)] = own.get(library(key), 0.0) + tt
    base = p.total_s or 1.0
    lines = ["| library | own (s) | share |", "| --- | ---: | ---: |"]
    for name, s in sorted(own.items(), key=lambda kv: kv[1], reverse=True)[:top]:
        lines.append(f"| {_cell(name)} | {_s(s)} | {s / base:.0%} |")
    return lines


def summary(folder: Path, top: int = 15) -> str:
    """The markdown for every profile in `folder`."""
    profiles = load(folder)
    if not profiles:
        return f"No profiles (*.prof) in {folder}.\n"
    out = [f"Profiles in `{folder.name}`: {len(profiles)} processes. cProfile sees each "
           "process (the thread that started it, on Python 3.11) from its profile's start "
           "('started after': the process's age then, which it could not see); its overhead "
           "slows Python-heavy code, so read shares, not benchmark figures.", "",
           *processes_table(profiles)]  # fmt: skip
    for p in profiles:
        out += ["", f"### {p.role} (pid {p.pid}): {p.covered_s:.2f} s covered", ""]
        out += [f"Top {top} by cumulative time:", "", *top_table(p, top, "cum"), ""]
        out += [f"Top {top} by own time:", "", *top_table(p, top, "own"), ""]
        out += ["Own time by library:", "", *library_table(p, top)]
    return "\n".join(out) + "\n"


def write_runs(folders: list[Path], md: Path, tgz: Path, top: int = 15) -> None:
    """Several runs' profile folders (the GPU command's --profile): their tables
    in one markdown file, a section each, and their files in one .tgz. Not a file per process:
    the device tool brings back 8 files at most."""
    folders = [f for f in folders if f.is_dir()]  # a run stopped before any process wrote
    text = ["# Profiles of the advise runs", ""]
    for folder in folders:
        text += [f"## {folder.name}", "", summary(folder, top)]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(text))
    with tarfile.open(tgz, "w:gz") as tar:
        for folder in folders:
            tar.add(folder, arcname=folder.name)
