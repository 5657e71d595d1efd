"""The suite: PyTorch's baselines vs the advisor, for the seeds' layers and real models.

For every case (see `benchmarks/suite_models.py`), in one run:

1. PyTorch's default;
2. `cudnn.benchmark` alone (CUDA only: n/a on CPU);
3. everything on: channels_last + AMP (fp16 with a GradScaler in training on CUDA, bf16 on CPU)
   + TF32 for convs and matmuls + cudnn.benchmark;
4. `torch.compile(model, mode="max-autotune")` with PyTorch's default flags, its compile time
   (the first three calls: compilation, autotuning, CUDA-graph capture) kept apart;
5. the advisor's pick: `advisor.advise` (its wall time kept), then `advisor.apply`;
6. the exhaustive best of the grid: the fastest accepted candidate the search measured, applied
   with `advisor.apply_settings`.

The advisor runs in its own process and every configuration is re-timed in a FRESH process, so
cuDNN's algorithm cache, compile caches and global flags never leak from one to the next (a
compile gets empty Inductor/Triton caches, so its compile time is a cold one). Each step is timed
with `torch.utils.benchmark` (blocked_autorange, which synchronises CUDA) on fresh random inputs;
a training step is forward + backward from a fixed random output gradient, gradients reset.
Results: a markdown table per case (median and IQR, ratio to the advisor's pick, tuning and
compile seconds, roofline fraction) and a summary, written to --out and its raw samples to
--out with .json (rewritten after every case, so a run cut short keeps what it measured).

    python benchmarks/suite.py --device cpu --quick --only seed_conv2d_3to16_infer
    python benchmarks/suite.py --device cuda --only 'seed_*' --deadline-s 560 \
        --out benchmarks/results/suite_cuda_seeds.md
    python benchmarks/suite.py --merge a.json b.json --out benchmarks/results/suite_cuda.md
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# suite_models sits beside this file; the repo root makes `advisor` importable uninstalled (as on
# a GPU machine that receives a copy of the tree).
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

CONFIGS = ("default", "cudnn_benchmark", "everything_on", "compile", "advisor", "exhaustive")
MARK = "SUITE_RESULT "  # prefixes the one JSON line a worker prints
HALF = ("fp16", "bf16")


# ======================================================================== workers (fresh processes)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def _env_job(job: dict[str, Any]) -> dict[str, Any]:
    """The environment and the device's measured peaks per precision."""
    import torch

    import advisor
    from advisor.measure.roofline import precision_peaks

    dev = torch.device(job["device"])
    env = advisor.current_environment(dev).model_dump(mode="json")
    precisions = ("fp32", "tf32", "fp16", "bf16") if dev.type == "cuda" else ("fp32", "bf16")
    peaks = {}
    for p in precisions:
        pk = precision_peaks(dev, p)  # under that precision's flags: fp32 means IEEE fp32
        peaks[p] = {"flops_per_s": pk.flops_per_s, "bytes_per_s": pk.bytes_per_s}
    return {"environment": env, "peaks": peaks}


def _advise_job(job: dict[str, Any]) -> dict[str, Any]:
    """Tune the case with `advisor.advise` over the whole grid (time budget allowing)."""
    import torch
    from suite_models import BY_NAME

    import advisor
    from advisor import impls
    from advisor.space import candidates, load_space

    case, quick = BY_NAME[job["case"]], job["quick"]
    dev = torch.device(job["device"])
    space = load_space(job["space"], dev)
    if case.layer is not None:  # a layer's implementations are part of the global grid
        module = case.make_model(quick)
        names = [
            n
            for n in impls.names()
            if impls.why_not(n, module, device=dev, dtype=torch.float32) is None
        ]
    else:  # a model's are chosen per layer after the global search
        names = ["native"]
    grid = len(candidates(space, dev, names)[0])
    # As many trials as grid points makes the search enumerate the grid (not sample it), so the
    # fastest accepted trial is the exhaustive best, unless the time budget cut the grid short.
    trials = job["trials"] or grid
    common = {"mode": case.mode, "device": job["device"], "space": job["space"], "trials": trials}
    t0 = time.perf_counter()
    if case.layer is not None:
        shape = list(case.shapes(quick)[0])
        advice = advisor.advise(layer=case.layer(quick), input_shape=shape, **common)
    else:
        advice = advisor.advise(case.make_model(quick), case.make_inputs(quick), **common)
    advise_s = time.perf_counter() - t0
    path = Path(job["outdir"]) / f"{case.name}.json"
    advice.save(path)  # and the trials table beside it
    ok = [r for r in advice.results if r.status == "ok" and r.measurement is not None]
    best = min(ok, key=lambda r: r.measurement.median_ms)  # type: ignore[union-attr]
    result = advice.config.result
    return {
        "advise_s": advise_s,
        "config_path": str(path),
        "settings": advice.settings.model_dump(mode="json"),
        "label": advice.settings.label(),
        "why": result.why if result else "",
        "best_settings": best.settings.model_dump(mode="json"),
        "best_label": best.settings.label(),
        "grid": grid,
        # grid trials only; the per-layer stage may add one whole-model combination on top
        "trials": sum(not r.settings.layers for r in advice.results),
        "accepted": sum(not r.settings.layers for r in ok),
        "per_layer_combinations": sum(bool(r.settings.layers) for r in advice.results),
        "rejected": sum(r.status == "rejected" for r in advice.results),
        "failed": sum(r.status == "failed" for r in advice.results),
    }


def _time_job(job: dict[str, Any]) -> dict[str, Any]:
    """Set one configuration up in this fresh process and time the case's step."""
    import torch
    import torch.utils.benchmark as tb
    from suite_models import BY_NAME

    case, quick, config = BY_NAME[job["case"]], job["quick"], job["config"]
    dev = torch.device(job["device"])
    cuda = dev.type == "cuda"
    train = case.mode == "train"
    if not cuda:
        # The glibc malloc state every advisor measurement and advisor.apply use (see
        # advisor/device/allocator.py): put every configuration there alike.
        from advisor.device.allocator import settle_cpu_allocator

        settle_cpu_allocator()
    model = case.make_model(quick).train(train)
    xs = [x.to(dev) for x in case.make_inputs(quick)]
    ctx: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    scaler = None
    net: Any = model
    label = "default"
    if config == "default":
        model.to(dev)
    elif config == "cudnn_benchmark":
        from advisor.knobs import GlobalFlags, Settings

        GlobalFlags.switch_to(Settings(cudnn_benchmark=True))
        model.to(dev)
        label = "cudnn_benchmark=on"
    elif config == "everything_on":
        half = torch.float16 if cuda else torch.bfloat16
        if cuda:  # through the advisor's one door for global flags
            from advisor.knobs import GlobalFlags, Settings

            GlobalFlags.switch_to(Settings(tf32="on", cudnn_benchmark=True))
        five_d = any(m.weight.dim() == 5 for m in model.modules() if isinstance(m, _conv_types()))
        fmt = torch.channels_last_3d if five_d else torch.channels_last
        model.to(dev, memory_format=fmt)
        xs = [x.contiguous(memory_format=fmt) if x.dim() == (5 if five_d else 4) else x for x in xs]

        def ctx() -> contextlib.AbstractContextManager[Any]:
            return torch.autocast(dev.type, dtype=half)

        if train and cuda:
            scaler = torch.amp.GradScaler("cuda")
        label = f"channels_last+{'fp16' if cuda else 'bf16'}" + ("+tf32+benchmark" if cuda else "")
    elif config == "compile":
        model.to(dev)
        net = torch.compile(model, mode=job["compile_mode"])
        label = f"torch.compile(mode={job['compile_mode']!r})"
    elif config in ("advisor", "exhaustive"):
        import advisor

        if config == "advisor":
            tuned = advisor.apply(job["config_path"], model, device=dev, training=train)
        else:
            settings = advisor.Settings(**job["settings"])
            tuned = advisor.apply_settings(settings, model, dev, training=train)
        net, ctx, scaler = tuned.model, tuned.autocast, tuned.scaler
        xs = list(tuned.inputs(*xs))
        label = tuned.settings.label()
    else:
        raise ValueError(f"unknown configuration {config!r}")

    grad: torch.Tensor | None = None

    def step() -> None:
        nonlocal grad
        if not train:
            with torch.no_grad(), ctx():
                net(*xs)
            return
        net.zero_grad(set_to_none=True)
        with ctx():
            out = net(*xs)
        if grad is None:
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dev)
        loss = (out.float() * grad).sum()
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    sync()
    t0 = time.perf_counter()
    step()  # lazy init, cuDNN's benchmark search, compilation: kept out of the samples
    sync()
    first_s = time.perf_counter() - t0
    for _ in range(2):  # torch.compile's CUDA graphs are recorded on the next calls
        step()
    sync()
    first3_s = time.perf_counter() - t0
    timer = tb.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    samples = sample_steps(timer, job["min_run_time"], job["min_samples"])
    peak_mb = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None
    return {
        "samples_ms": samples,
        "first_call_s": first_s,
        "first3_s": first3_s,
        "label": label,
        "peak_memory_mb": peak_mb,
    }


def sample_steps(
    timer: Any,
    min_run_time: float,
    min_samples: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Per-step times (ms) from `timer.blocked_autorange` (a `torch.utils.benchmark.Timer`)
    until there are `min_samples`: long steps give few blocks per call. At most 20 x
    `min_run_time` is spent (on `clock`): a generous cap, since on a loaded machine blocks are
    slow and few samples make the table's intervals meaningless; the report names a
    configuration it left with fewer."""
    samples: list[float] = []
    start = clock()
    while len(samples) < min_samples and clock() - start <= 20 * min_run_time:
        m = timer.blocked_autorange(min_run_time=min_run_time)
        samples += [t * 1e3 for t in m.times]  # per step: block time / steps per block
    return samples


def _conv_types() -> tuple[type, ...]:
    from torch import nn

    return (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
            nn.ConvTranspose3d)  # fmt: skip


def worker_main(job_text: str) -> int:
    job = json.loads(job_text)
    from advisor.device.allocator import settle_cpu_allocator

    settle_cpu_allocator()  # CPU runs: timed from the allocator state of a training loop
    jobs = {"env": _env_job, "advise": _advise_job, "time": _time_job}
    try:
        result = jobs[job["kind"]](job)
    except Exception as e:  # noqa: BLE001 - any failure (OOM, compile error) becomes a row
        result = {"error": _first_line(e)}
    print(MARK + json.dumps(result), flush=True)
    return 0


# ======================================================================== the conductor


def run_job(job: dict[str, Any], timeout: float, extra_env: dict[str, str] | None = None) -> dict:
    """Run one job in a fresh Python process; its result, or {'error': ...}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)]
    env = {**os.environ, **(extra_env or {})}
    # A session of its own, so a timeout also ends the job's children (compile workers).
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    return {"error": f"exit code {p.returncode}: {tail[0][:200]}"}


def conv_stats(case: Any, quick: bool) -> list[list[float]]:
    """Per conv call of the case's step: [FLOPs, min bytes at 4-byte, at 2-byte elements].

    Shapes come from forward hooks on a meta-device copy: no memory, no compute.
    """
    import torch

    from advisor.impls.base import ConvSignature
    from advisor.measure.roofline import conv_flops, conv_min_bytes

    train = case.mode == "train"
    rows: list[list[float]] = []

    def hook(module: Any, inputs: tuple[Any, ...], _out: Any) -> None:
        sig = ConvSignature.from_module(module)
        shape = tuple(inputs[0].shape)
        rows.append(
            [
                float(conv_flops(sig, shape, train)),
                float(conv_min_bytes(sig, shape, torch.float32, train)),
                float(conv_min_bytes(sig, shape, torch.float16, train)),
            ]
        )

    with torch.device("meta"):
        torch.manual_seed(0)
        model = case.build(quick)
        xs = [torch.empty(s) for s in case.shapes(quick)]
    for m in model.modules():
        if isinstance(m, _conv_types()):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model.train(train)(*xs)
    return rows


def conv_floor_ms(stats: list[list[float]], peaks: dict[str, Any], precision: str) -> float:
    """Roofline floor of the conv layers alone: each layer bound by its FLOPs or its bytes."""
    pk = peaks.get(precision) or peaks.get("fp32")
    col = 2 if precision in HALF else 1
    return 1e3 * sum(max(r[0] / pk["flops_per_s"], r[col] / pk["bytes_per_s"]) for r in stats)


def precision_of(config: str, settings: dict[str, Any] | None, cuda: bool) -> str:
    """The precision a configuration computes its convs in (for the roofline peak)."""
    if config == "everything_on":
        return "fp16" if cuda else "bf16"
    if config in ("advisor", "exhaustive") and settings:
        if settings.get("amp", "off") != "off":
            return settings["amp"]
        return "tf32" if cuda and settings.get("tf32", "conv") != "off" else "fp32"
    return "tf32" if cuda else "fp32"  # PyTorch's default: TF32 for cuDNN convs


def write_space(base: str, advise_time: float, timing_cap: float, path: Path) -> str:
    """A copy of the built-in space with a smaller time budget, so the suite fits a device call."""
    from importlib import resources

    import yaml

    data = yaml.safe_load((resources.files("search_spaces") / f"{base}.yaml").read_text())
    data["name"] = f"{base}-suite"
    data["budget"]["time_s"] = advise_time
    data["timing"]["max_time_s"] = timing_cap
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


class Clock:
    """The suite's wall-clock deadline; every job's timeout is capped by what is left."""

    def __init__(self, deadline_s: float | None) -> None:
        self.start = time.perf_counter()
        self.deadline_s = deadline_s

    def left(self) -> float:
        if self.deadline_s is None:
            return math.inf
        return self.deadline_s - (time.perf_counter() - self.start)

    def cap(self, timeout: float) -> float:
        return min(timeout, self.left())


def select_cases(patterns: list[str] | None) -> list[Any]:
    from suite_models import CASES

    if not patterns:
        return list(CASES)
    chosen = [c for c in CASES if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatch(c.name, p) for c in CASES)]
    if unknown:
        names = ", ".join(c.name for c in CASES)
        raise SystemExit(f"no case matches {', '.join(unknown)}; cases: {names}")
    return chosen


def run_case(
    case: Any, args: argparse.Namespace, data: dict[str, Any], work: Path, clock: Clock
) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    rec: dict[str, Any] = {
        "name": case.name,
        "mode": case.mode,
        "description": case.description,
        "inputs": [list(s) for s in case.shapes(args.quick)],
        "layer": case.layer is not None,
        "configs": {},
    }
    missing = case.missing()
    if missing:
        rec["skipped"] = f"skipped: {missing}"
        return rec
    try:
        stats = conv_stats(case, args.quick)
        rec["conv_gflop"] = sum(r[0] for r in stats) / 1e9
        rec["conv_layers"] = len(stats)
        rec["floor_ms"] = {p: conv_floor_ms(stats, data["peaks"], p) for p in data["peaks"]}
    except Exception as e:  # noqa: BLE001 - the roofline is a column, not the case
        rec["floor_error"] = _first_line(e)

    base = {"case": case.name, "quick": args.quick, "device": args.device}
    wanted = [c for c in CONFIGS if c in args.configs]
    adv: dict[str, Any] = {}
    if "advisor" in wanted or "exhaustive" in wanted:
        print(f"  advise ({case.mode}) ...", flush=True)
        job = {**base, "kind": "advise", "space": args.space_file, "trials": args.trials}
        adv = run_job({**job, "outdir": str(work)}, clock.cap(args.advise_timeout))
        rec["advise"] = adv
        msg = adv.get("error") or f"{adv['label']} in {adv['advise_s']:.1f} s"
        print(f"  advise: {msg}", flush=True)

    configs: dict[str, dict[str, Any]] = {}
    todo: list[str] = []
    for c in wanted:
        if c == "cudnn_benchmark" and not cuda:
            configs[c] = {"na": "CUDA only"}
        elif c in ("advisor", "exhaustive") and "error" in adv:
            configs[c] = {"error": f"advise failed: {adv['error']}"}
        elif c == "exhaustive" and adv.get("best_settings") == adv.get("settings"):
            configs[c] = {"same_as_advisor": True}
        else:
            todo.append(c)
    caches = {"TORCHINDUCTOR_CACHE_DIR": str(args.cache_root / f"{case.name}.inductor"),
              "TRITON_CACHE_DIR": str(args.cache_root / f"{case.name}.triton")}  # fmt: skip
    for r in range(args.rounds):
        for c in todo if r % 2 == 0 else list(reversed(todo)):  # A B .. B A: drift cancels
            if clock.left() < 15:
                configs.setdefault(c, {"error": "not run: the suite's deadline"})
                continue
            job = {
                **base,
                "kind": "time",
                "config": c,
                "min_run_time": args.min_run_time,
                "min_samples": args.min_samples,
                "compile_mode": args.compile_mode,
                "config_path": adv.get("config_path"),
                "settings": adv.get("best_settings"),
            }
            timeout = args.compile_timeout if c == "compile" else args.config_timeout
            # Empty compile caches in the first round: the compile time reported is a cold one.
            res = run_job(job, clock.cap(timeout), caches if c == "compile" else None)
            prev = configs.get(c)
            if prev and "samples_ms" in prev and "samples_ms" in res:
                prev["samples_ms"] += res["samples_ms"]
            elif not prev or "error" in prev:
                configs[c] = res
            shown = res.get("error") or _ms(res["samples_ms"])
            print(f"  {c} (round {r + 1}): {shown}", flush=True)
    rec["configs"] = {c: configs[c] for c in wanted if c in configs}
    return rec


def _ms(samples: list[float]) -> str:
    from advisor.measure.stats import Measurement

    m = Measurement(samples_ms=samples)
    return f"{m.median_ms:.3f} ms (IQR {m.iqr_ms:.3f}, {len(samples)} samples)"


# ======================================================================== the report

TITLES = {
    "default": "PyTorch default",
    "cudnn_benchmark": "cudnn.benchmark alone",
    "everything_on": "everything on",
    "compile": "torch.compile",
    "advisor": "advisor's pick",
    "exhaustive": "exhaustive best of the grid",
}


def _stats(cfg: dict[str, Any]) -> tuple[float, float] | None:
    from advisor.measure.stats import Measurement

    if not cfg.get("samples_ms"):
        return None
    m = Measurement(samples_ms=cfg["samples_ms"])
    return m.median_ms, m.iqr_ms


def _resolved(rec: dict[str, Any], name: str) -> dict[str, Any]:
    cfg = rec["configs"].get(name, {})
    return rec["configs"].get("advisor", {}) if cfg.get("same_as_advisor") else cfg


def _flop(x: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} FLOP"


def render(data: dict[str, Any]) -> str:
    from advisor.measure.stats import Measurement, clearly_faster

    env, opts = data["environment"], data["options"]
    cuda = env.get("device_type") == "cuda"
    lines = [f"# Suite: PyTorch baselines vs the advisor ({env.get('device_type')})", ""]
    lines += [f"Command: `{c}`" for c in data["commands"]]
    lines += [
        "",
        f"Environment: {env.get('device_name')}"
        + (
            f" (capability {env.get('capability')}, {env.get('device_memory_gb')} GB)"
            if cuda
            else ""
        )
        + f"; driver {env.get('driver')}; torch {env.get('torch')}; CUDA {env.get('cuda')}; "
        f"cuDNN {env.get('cudnn')}; triton {env.get('triton')}; Python {env.get('python')}; "
        f"{env.get('cpu_threads')} CPU threads; {env.get('platform')}; "
        f"fingerprint {env.get('fingerprint')}.",
        "Measured peaks (a large matmul, a large copy): "
        + "; ".join(f"{p} {v['flops_per_s'] / 1e12:.1f} TFLOP/s" for p, v in data["peaks"].items())
        + f"; copy {next(iter(data['peaks'].values()))['bytes_per_s'] / 1e9:.0f} GB/s.",
        "",
        "How: every configuration is set up and timed in a fresh process with "
        "`torch.utils.benchmark` (blocked_autorange, "
        f"min_run_time {opts['min_run_time']} s, at least {opts['min_samples']} samples"
        f"{', ' + str(opts['rounds']) + ' rounds in alternating order' if opts['rounds'] > 1 else ''}"
        "); train = forward + backward from a fixed random output gradient, gradients reset; "
        "infer = forward under no_grad. **x vs advisor** = configuration time / advisor's-pick "
        "time: above 1 the configuration is slower than the advisor's pick. The advisor searched "
        f"the `{opts['space']}` space with budget.time_s={opts['advise_time']} and timing "
        f"max_time_s={opts['timing_cap']} per candidate, trials = "
        f"{opts['trials'] or 'the whole grid'}; its tuning time is the wall time of "
        "`advisor.advise`. torch.compile ran with "
        f"mode={opts['compile_mode']!r} and PyTorch's default flags; its compile time is the wall "
        "time of its first three calls (compilation, autotuning, CUDA-graph capture) with empty "
        "compile caches. **Roofline**: the floor of the case's conv layers alone (each layer "
        "bound by its FLOPs or its fewest bytes at the measured peak of the precision the "
        "configuration computes in, backward = 2x forward) over the measured step time; for the "
        "single-layer seed cases that is the layer's roofline fraction, for models and the "
        "ConvTranspose2d + BatchNorm cases a conv-only fraction (other layers' time counts "
        "against it).",
    ]
    summary = []
    for rec in data["cases"]:
        lines += ["", f"## {rec['name']}", "", rec["description"] + "."]
        if opts.get("quick"):
            shapes = ", ".join("x".join(map(str, s)) for s in rec.get("inputs", []))
            lines.append(f"Quick run: reduced sizes, inputs {shapes}.")
        if rec.get("skipped"):
            lines.append(rec["skipped"] + ".")
            summary.append(f"| {rec['name']} | {rec['skipped']} | | | | | | |")
            continue
        adv = rec.get("advise", {})
        if adv and "error" not in adv:
            cut = (
                f" (the time budget stopped it before the grid's {adv['grid']} points)"
                if adv["trials"] < adv["grid"]
                else ""
            )
            lines.append(
                f"Advisor: {adv['trials']} candidates measured, global grid of {adv['grid']}{cut}"
                f"{' plus the per-layer stage' if not rec.get('layer') else ''}: "
                f"{adv['accepted']} accepted, {adv['rejected']} rejected by the numeric gate, "
                f"{adv['failed']} failed. Pick: `{adv['label']}` — {adv['why']}"
            )
        elif adv:
            lines.append(f"Advisor failed: {adv['error']}")
        if "conv_gflop" in rec:
            lines.append(
                f"Conv work per step: {_flop(rec['conv_gflop'] * 1e9)} over {rec['conv_layers']} "
                "conv calls."
            )
        lines += [
            "",
            "| configuration | settings | median ms (IQR) | x vs advisor | tuning / compile s "
            "| first call ms | conv roofline | notes |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        a_cfg = _resolved(rec, "advisor")
        a_stats = _stats(a_cfg)
        beaten = []
        for name, cfg in rec["configs"].items():
            title = TITLES[name]
            if name == "compile":
                title = f"torch.compile({opts['compile_mode']})"
            if cfg.get("na"):
                lines.append(f"| {title} | | n/a | | | | | {cfg['na']} |")
                continue
            shown = _resolved(rec, name)
            if "error" in shown:
                lines.append(f"| {title} | | failed | | | | | {shown['error']} |")
                continue
            med, iqr = _stats(shown) or (math.nan, math.nan)
            settings = None
            if name == "advisor":
                settings = adv.get("settings")
            elif name == "exhaustive":
                settings = adv.get("best_settings")
            label = adv.get("best_label") if name == "exhaustive" else shown.get("label")
            ratio = f"{med / a_stats[0]:.2f}x" if a_stats else "-"
            tuning = ""
            if name == "advisor" and adv.get("advise_s") is not None:
                tuning = f"{adv['advise_s']:.1f}"
            elif name == "compile":
                tuning = f"{shown['first3_s']:.1f}"
            prec = precision_of(name, settings, cuda)
            floor = rec.get("floor_ms", {}).get(prec)
            roof = f"{floor / med * 100:.2g}% ({prec})" if floor and med == med else "-"
            notes = []
            if cfg.get("same_as_advisor"):
                notes.append("same settings as the advisor's pick (its timing)")
            if name == "exhaustive":
                notes.append("from the advisor's search")
            if len(shown["samples_ms"]) < opts["min_samples"]:
                notes.append(
                    f"only {len(shown['samples_ms'])} samples: the time cap (20 x min_run_time) "
                    "ran out (a busy machine or a long step)"
                )
            if shown.get("peak_memory_mb"):
                notes.append(f"peak {shown['peak_memory_mb']:.0f} MiB")
            if a_stats and name not in ("advisor",) and not cfg.get("same_as_advisor"):
                fast = Measurement(samples_ms=shown["samples_ms"])
                slow = Measurement(samples_ms=a_cfg["samples_ms"])
                if clearly_faster(fast, slow):
                    notes.append("**faster than the advisor's pick beyond noise**")
                    beaten.append(title)
            lines.append(
                f"| {title} | `{label}` | {med:.3f} ({iqr:.3f}) | {ratio} | {tuning} "
                f"| {shown['first_call_s'] * 1e3:.1f} | {roof} | {'; '.join(notes)} |"
            )
        e_stats = _stats(_resolved(rec, "exhaustive"))
        gap = f"{(a_stats[0] / e_stats[0] - 1) * 100:+.1f}%" if a_stats and e_stats else "-"
        comp = rec["configs"].get("compile", {})
        a_ms = f"{a_stats[0]:.3f}" if a_stats else "-"
        advise_s = f"{adv['advise_s']:.0f}" if "advise_s" in adv else "-"
        compile_s = f"{comp['first3_s']:.0f}" if "first3_s" in comp else comp.get("error", "-")
        summary.append(
            f"| {rec['name']} | `{adv.get('label', '-')}` | {a_ms} | "
            f"`{adv.get('best_label', '-')}` | {gap} "
            f"| {', '.join(beaten) or ('none' if a_stats else '-')} | {advise_s} | {compile_s} |"
        )
    lines += [
        "",
        "## Summary",
        "",
        "Gap = advisor's pick / exhaustive best - 1, both re-timed in fresh processes (above 0: "
        "the pick is slower). 'Beyond noise' = faster by at least 2% with Mann-Whitney p < 0.05 "
        "on the re-timed samples (`advisor.measure.stats.clearly_faster`).",
        "",
        "| case | advisor's pick | advisor ms | exhaustive best | gap | beat the advisor beyond "
        "noise | advise s | compile s |",
        "| --- | --- | ---: | --- | ---: | --- | ---: | ---: |",
        *summary,
    ]
    return "\n".join(lines) + "\n"


def write_outputs(data: dict[str, Any], out: Path | None) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data))
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))


def merge(paths: list[str], out: Path | None) -> int:
    """One report from several runs' JSON files (the suite split across device calls)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    prints = {p["environment"].get("fingerprint") for p in parts}
    if len(prints) > 1:
        print(f"warning: the parts come from {len(prints)} environments", file=sys.stderr)
    data = {**first, "commands": [c for p in parts for c in p["commands"]]}
    data["cases"] = [c for p in parts for c in p["cases"]]
    text = render(data)
    print(text)
    write_outputs(data, out)
    return 0


# ======================================================================== command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="case names or globs ('seed_*')")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--out", type=Path, help="markdown file (and raw results beside it, .json)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="render one report from runs")
    ap.add_argument("--trials", type=int, help="advise trials (default: the whole grid)")
    ap.add_argument("--advise-time", type=float, help="advise budget.time_s")
    ap.add_argument("--timing-cap", type=float, help="advise timing max_time_s per candidate")
    ap.add_argument("--min-run-time", type=float, help="blocked_autorange min_run_time, s")
    ap.add_argument("--min-samples", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="re-time rounds, alternating order")
    ap.add_argument("--compile-mode", help="torch.compile mode (CUDA: max-autotune)")
    ap.add_argument("--advise-timeout", type=float, default=300.0)
    ap.add_argument("--config-timeout", type=float, default=120.0)
    ap.add_argument("--compile-timeout", type=float, default=300.0)
    ap.add_argument("--deadline-s", type=float, help="stop starting work after this many s")
    ap.add_argument("--keep", type=Path, help="keep the tuned configs and trial tables here")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    small = args.quick and not cuda
    # Defaults sized so the seeds fit one 10-minute device call and the models two more.
    if args.advise_time is None:
        args.advise_time = 10.0 if small else 60.0
    if args.timing_cap is None:
        args.timing_cap = 0.05 if small else 0.25
    if args.min_run_time is None:
        args.min_run_time = 0.1 if small else 0.5
    if args.compile_mode is None:
        # Inductor's CPU max-autotune benchmarks C++ GEMM templates: minutes even for a tiny conv.
        args.compile_mode = "max-autotune" if cuda else "default"
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1])
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.list:
        from suite_models import CASES

        for c in CASES:
            print(f"{c.name:32} {c.description}")
        return 0
    cases = select_cases(args.only)
    clock = Clock(args.deadline_s)
    env = run_job({"kind": "env", "device": args.device}, 300)
    if "error" in env:
        print(f"cannot read the environment: {env['error']}", file=sys.stderr)
        return 1
    command = "python benchmarks/suite.py " + " ".join(shlex.quote(a) for a in argv)
    data: dict[str, Any] = {
        "commands": [command],
        "environment": env["environment"],
        "peaks": env["peaks"],
        "cases": [],
    }
    e = env["environment"]
    print(f"{e['device_name']} | torch {e['torch']} | CUDA {e['cuda']} | cuDNN {e['cudnn']}")
    with tempfile.TemporaryDirectory(prefix="suite-") as tmp:
        work = args.keep or Path(tmp)
        args.cache_root = Path(tmp)  # compile caches: never kept
        work.mkdir(parents=True, exist_ok=True)
        base_space = "cuda" if args.device.startswith("cuda") else "cpu"
        args.space_file = write_space(
            base_space, args.advise_time, args.timing_cap, work / "space.yaml"
        )
        data["options"] = {
            "space": base_space,
            "advise_time": args.advise_time,
            "timing_cap": args.timing_cap,
            "trials": args.trials,
            "min_run_time": args.min_run_time,
            "min_samples": args.min_samples,
            "rounds": args.rounds,
            "compile_mode": args.compile_mode,
            "quick": args.quick,
        }
        for case in cases:
            if clock.left() < 30:
                rec = {"name": case.name, "mode": case.mode, "description": case.description,
                       "configs": {}, "skipped": "not run: the suite's deadline"}  # fmt: skip
            else:
                print(f"{case.name}: {case.description}", flush=True)
                rec = run_case(case, args, data, work, clock)
            data["cases"].append(rec)
            write_outputs(data, args.out)  # after every case: a run cut short keeps its rows
    text = render(data)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
