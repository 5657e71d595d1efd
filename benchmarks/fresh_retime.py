"""Re-time tuned settings independently: several variants of one workload, in a fresh process.

Used by advisor_vs_defaults.py, model_retime.py and zoo.py. The child process rebuilds the
workload from the config, applies each variant with `advisor.apply` to its own copy of the model
(same weights), compares outputs and gradients with the untuned fp32 model, then times the steps
with the advisor's one interleaving sampler (`advisor.measure.timing.sample_interleaved`: rounds A B C,
C B A, ...) so drift hits every variant alike. Returns, per variant, the median, IQR and 95% CI
of its samples, the samples, and the errors.

A variant is a `Settings` dict (one with `compile` is compiled by `advisor.apply`, as a user gets
it; its first call is `first_call_s`), or `{"compile": MODE}` alone (`compile_variant`): the
untouched model under PyTorch's default settings, wrapped in `torch.compile(mode=MODE)` by hand,
the rival's baseline. Its first call (with
max-autotune on CUDA, its first three: compilation, autotuning, CUDA-graph capture) is timed apart
as `compile_s` / `first3_s` and kept out of the samples. The model is called as the workload says
(positional and keyword inputs: advisor.workload.model_file's convention); dropout is seeded alike before
every error check.

    python benchmarks/fresh_retime.py tuned.json train cpu '{"default": {}, "advisor": {...}}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parent.parent


def everything_on(device: str) -> dict[str, Any]:
    """What a "switch everything on" helper does: channels_last + AMP (+ TF32, cudnn.benchmark)."""
    if device.startswith("cuda"):
        return {"memory_format": "channels_last", "amp": "fp16", "tf32": "on",
                "cudnn_benchmark": True}  # fmt: skip
    return {"memory_format": "channels_last", "amp": "bf16"}


def compile_variant(device: str) -> dict[str, Any]:
    """`torch.compile` as its users reach for it: max-autotune on CUDA; the default mode on a CPU
    (Inductor's CPU max-autotune benchmarks C++ GEMM templates: minutes even for a tiny conv)."""
    return {"compile": "max-autotune" if device.startswith("cuda") else "default"}


def retime_variants(
    config: Path,
    variants: dict[str, dict[str, Any]],
    mode: str,
    device: str,
    rounds: int = 6,
    min_run_time_s: float = 0.5,
    plain: bool = False,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run this file in a fresh process; raises RuntimeError with the child's last line (or
    after `timeout_s`). `env` adds environment variables (compile caches) to the child's.

    With `plain`, also time PyTorch untouched ("plain") in a second fresh process: the model and
    a bare training/inference loop, without `advisor.apply` and so without its CPU allocator
    settling (see advisor/device/allocator.py): what a user's script gets before it applies anything.
    """
    args = [str(config), mode, device, json.dumps(variants), str(rounds), str(min_run_time_s)]
    out = _run([*args], timeout_s, env)
    if plain:
        out["plain"] = _run(["--plain", *args], timeout_s, env)
    return out


def _run(
    args: list[str], timeout_s: float | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    ), **(env or {})}  # fmt: skip
    try:
        r = subprocess.run(
            [sys.executable, __file__, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=timeout_s,
            env=full_env,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout_s:.0f} s") from None
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or ["no output"]
        raise RuntimeError(lines[-1])
    return json.loads(r.stdout)


def _rival(variant: dict[str, Any]) -> bool:
    """`{"compile": MODE}` alone: torch.compile by hand on the untouched model (a Settings dict
    that compiles has every other field too)."""
    return set(variant) == {"compile"}


def _stats(samples: list[float]) -> dict[str, Any]:
    from advisor.measure.stats import Measurement

    m = Measurement(samples_ms=samples)
    return {
        "median_ms": m.median_ms,
        "iqr_ms": m.iqr_ms,
        "ci_low_ms": m.ci_low_ms,
        "ci_high_ms": m.ci_high_ms,
        "blocks": len(samples),
        "samples_ms": samples,
    }


def loss(outs: list[torch.Tensor], gs: list[torch.Tensor]) -> torch.Tensor:
    """What a training step backpropagates: the outputs weighted by fixed random seeds."""
    return sum(  # type: ignore[return-value]
        (o.float() * g).sum() for o, g in zip(outs, gs, strict=True) if o.requires_grad
    )


def grad_seeds(outs: list[torch.Tensor], dev: torch.device) -> list[torch.Tensor]:
    """The loss's weights, one per floating output, drawn alike in every process."""
    import torch

    gen = torch.Generator().manual_seed(1)
    return [torch.randn(o.shape, generator=gen).to(dev) for o in outs]


@dataclass
class Variant:
    """One variant set up as a user gets it: `advisor.apply` on its own copy of the model, or
    the untouched model under `torch.compile` by hand (a rival); `step` is one training (or
    inference) step of it. Shared by this file's one-process re-time and process_retime.py's
    process per variant."""

    label: str
    tuned: Any  # advisor.apply's Tuned (its flags stay set until `tuned.restore()`)
    net: Any  # what is called: `tuned.model`, or a rival's torch.compile of it
    inputs: tuple[Any, ...]
    kwargs: dict[str, Any]
    step: Callable[[], None]
    compile_mode: str | None  # a rival's torch.compile mode; None otherwise


def build_variant(
    cfg: Any,
    workload: Any,
    x: tuple[Any, ...],
    kw: dict[str, Any],
    variant: dict[str, Any],
    training: bool,
    gs: list[torch.Tensor],
    dev: torch.device,
) -> Variant:
    """Apply `variant` (a Settings dict, or `{"compile": MODE}` alone) to a fresh copy of
    `workload`'s model. `gs` holds the loss's weights; empty, the first training step fills
    it (`grad_seeds`), for a process that runs no untuned reference first."""
    import torch

    import advisor
    from advisor.execute.runner import flatten_tensors

    compile_mode = variant["compile"] if _rival(variant) else None
    settings = advisor.Settings() if compile_mode else advisor.Settings.model_validate(variant)
    c = cfg.model_copy(update={"settings": settings})
    tuned = advisor.apply(c, workload.make_model().train(training), device=dev)
    xt = tuned.inputs(*x)
    kwt = dict(zip(kw, tuned.inputs(*kw.values()), strict=True))
    net: Any = tuned.model
    if compile_mode:
        net = torch.compile(tuned.model, mode=compile_mode)

    def step() -> None:
        if not training:
            with torch.no_grad(), tuned.autocast():
                net(*xt, **kwt)
            return
        tuned.model.zero_grad(set_to_none=True)
        with tuned.autocast():
            outs = flatten_tensors(net(*xt, **kwt))
        floats = [o for o in outs if o.is_floating_point()]
        if not gs:
            gs.extend(grad_seeds(floats, dev))
        loss(floats, gs).backward()

    label = f"torch.compile(mode={compile_mode!r})" if compile_mode else settings.label()
    return Variant(label, tuned, net, xt, kwt, step, compile_mode)


def compile_first_calls(v: Variant, dev: torch.device) -> dict[str, float]:
    """A rival's first call (it compiles: forward and, in training, backward) and its first
    three (with CUDA graphs, max-autotune on CUDA, the next two record them), in seconds: what
    a user pays before the steady state, kept out of the samples."""
    import time

    from advisor.measure.timing import synchronize

    synchronize(dev)
    t0 = time.perf_counter()
    v.step()
    synchronize(dev)
    compile_s = time.perf_counter() - t0
    for _ in range(2):
        v.step()
    synchronize(dev)
    return {"compile_s": compile_s, "first3_s": time.perf_counter() - t0}


def _plain_child(argv: list[str]) -> dict[str, Any]:
    import torch

    from advisor.config import load_config
    from advisor.execute.runner import flatten_tensors
    from advisor.measure.timing import TimingPolicy, measure
    from advisor.workload.rebuild import workload_from_info

    cfg_path, mode, device, _variants, rounds, min_run = argv
    dev = torch.device(device)
    workload = workload_from_info(load_config(cfg_path).workload)
    x, kw = workload.make_call(dev, seed=7)
    model = workload.make_model().to(dev).train(mode == "train")
    gs: list[torch.Tensor] = []

    def step() -> None:
        if mode != "train":
            with torch.no_grad():
                model(*x, **kw)
            return
        model.zero_grad(set_to_none=True)
        outs = flatten_tensors(model(*x, **kw))
        outs = [o for o in outs if o.is_floating_point() and o.requires_grad]
        if not gs:
            gs.extend(torch.randn(o.shape, device=dev) for o in outs)
        sum((o * g).sum() for o, g in zip(outs, gs, strict=True)).backward()  # type: ignore[union-attr]

    budget = float(min_run) * int(rounds)
    # Warm up for a quarter of the budget: a fresh process's first calls (thread pools, lazy
    # init) are not the steady state. glibc's page faults on large buffers are: they recur on
    # every call until a large block is freed (advisor/device/allocator.py), so warming up keeps them.
    policy = TimingPolicy(
        warmup_runs=3,
        warmup_s=budget / 4,
        min_samples=10,
        max_samples=10_000,
        target_rel_ci=1e-9,
        max_time_s=budget,
    )
    m = measure(step, dev, policy)
    return _stats(list(m.samples_ms))


def _child(argv: list[str]) -> dict[str, Any]:
    import time
    import warnings
    from functools import partial

    import torch

    from advisor.config import load_config
    from advisor.device.allocator import settle_cpu_allocator
    from advisor.errors import first_line
    from advisor.execute.runner import flatten_tensors
    from advisor.knobs import GlobalFlags, Settings
    from advisor.measure.timing import Sampler, sample_interleaved
    from advisor.workload.rebuild import workload_from_info

    warnings.simplefilter("ignore")
    settle_cpu_allocator()  # every variant timed from the allocator state of a training loop
    cfg_path, mode, device, variants_json, rounds, min_run = argv
    dev = torch.device(device)
    cfg = load_config(cfg_path)
    workload = workload_from_info(cfg.workload)
    x, kw = workload.make_call(dev, seed=7)
    training = mode == "train"

    def call(net: Any, xs: tuple[Any, ...], kws: dict[str, Any]) -> list[torch.Tensor]:
        torch.manual_seed(0)  # dropout: the same mask for every variant's error check
        return [o for o in flatten_tensors(net(*xs, **kws)) if o.is_floating_point()]

    base = workload.make_model().to(dev).train(training)
    with torch.enable_grad():
        ref = call(base, x, kw)
    gs = grad_seeds(ref, dev)
    if training:
        loss(ref, gs).backward()

    def flat_grads(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat(
            [p.grad.float().flatten() for p in model.parameters() if p.grad is not None]
        )

    ref_g = flat_grads(base) if training else None
    ref_out = torch.cat([o.detach().float().flatten() for o in ref])
    runs: dict[str, tuple[Settings, Any]] = {}
    out: dict[str, Any] = {}
    # torch.compile variants first: their compile_s is a cold compile only while nothing else
    # in this process compiled (a pick that compiles the same graph would leave it warm).
    order = sorted(json.loads(variants_json).items(), key=lambda kv: not _rival(kv[1]))
    for name, s in order:
        v = build_variant(cfg, workload, x, kw, s, training, gs, dev)
        tuned, net, xt, kwt = v.tuned, v.net, v.inputs, v.kwargs
        entry: dict[str, Any] = {"label": v.label}
        try:
            if v.compile_mode:
                entry.update(compile_first_calls(v, dev))
            tuned.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()  # a pick that compiles: its compile, as `apply` gives it
            if training:
                with tuned.autocast():
                    got = call(net, xt, kwt)
                loss(got, gs).backward()
            else:  # the step's own graph: no_grad (a compiled model would compile again)
                with torch.no_grad(), tuned.autocast():
                    got = call(net, xt, kwt)
            entry.setdefault("first_call_s", time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - a variant that fails is a row, not the run
            out[name] = {**entry, "error": first_line(e)}
            tuned.restore()
            continue
        got_out = torch.cat([o.detach().float().flatten() for o in got])
        entry.update(
            err=((got_out - ref_out).norm() / ref_out.norm()).item(),
            grad_err=((flat_grads(tuned.model) - ref_g).norm() / ref_g.norm()).item()
            if ref_g is not None
            else None,
            layers={k: impl for k, impl in tuned.layer_impls.items() if impl != "native"},
        )
        out[name] = entry
        runs[name] = (tuned.settings, v.step)
        tuned.restore()

    names = list(runs)
    samples = sample_interleaved(
        [runs[n][1] for n in names],
        Sampler(dev),
        before=[partial(GlobalFlags.switch_to, runs[n][0]) for n in names],
        warmup=2,
        min_rounds=10,
        max_rounds=100_000,
        budget_s=float(min_run) * int(rounds),
    )
    for name, samples_ms in zip(names, samples, strict=True):
        out[name].update(_stats(samples_ms))
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if sys.argv[1] == "--plain":
        print(json.dumps(_plain_child(sys.argv[2:])))
    else:
        print(json.dumps(_child(sys.argv[1:])))
