"""Re-time tuned settings independently: several variants of one workload, in a fresh process.

Used by advisor_vs_defaults.py and model_retime.py. The child process rebuilds the workload from
the config, applies each variant with `advisor.apply` to its own copy of the model (same weights),
compares outputs and gradients with the untuned fp32 model, then times the steps with the
advisor's one interleaving sampler (`advisor.timing.sample_interleaved`: rounds A B C, C B A, ...)
so drift hits every variant alike. Returns, per variant, the median and IQR of its samples, and
the errors.

    python benchmarks/fresh_retime.py tuned.json train cpu '{"default": {}, "advisor": {...}}'
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def everything_on(device: str) -> dict[str, Any]:
    """What a "switch everything on" helper does: channels_last + AMP (+ TF32, cudnn.benchmark)."""
    if device.startswith("cuda"):
        return {"memory_format": "channels_last", "amp": "fp16", "tf32": "on",
                "cudnn_benchmark": True}  # fmt: skip
    return {"memory_format": "channels_last", "amp": "bf16"}


def retime_variants(
    config: Path,
    variants: dict[str, dict[str, Any]],
    mode: str,
    device: str,
    rounds: int = 6,
    min_run_time_s: float = 0.5,
    plain: bool = False,
) -> dict[str, Any]:
    """Run this file in a fresh process; raises RuntimeError with the child's last line.

    With `plain`, also time PyTorch untouched ("plain") in a second fresh process: the model and
    a bare training/inference loop, without `advisor.apply` and so without its CPU allocator
    settling (see advisor/allocator.py): what a user's script gets before it applies anything.
    """
    args = [str(config), mode, device, json.dumps(variants), str(rounds), str(min_run_time_s)]
    out = _run([*args])
    if plain:
        out["plain"] = _run(["--plain", *args])
    return out


def _run(args: list[str]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or ["no output"]
        raise RuntimeError(lines[-1])
    return json.loads(r.stdout)


def _plain_child(argv: list[str]) -> dict[str, Any]:
    import torch

    from advisor.config import load_config
    from advisor.runner import flatten_tensors
    from advisor.timing import TimingPolicy, measure
    from advisor.workload import workload_from_info

    cfg_path, mode, device, _variants, rounds, min_run = argv
    dev = torch.device(device)
    workload = workload_from_info(load_config(cfg_path).workload)
    x = workload.make_inputs(dev, seed=7)
    model = workload.make_model().to(dev).train(mode == "train")
    gs: list[torch.Tensor] = []

    def step() -> None:
        if mode != "train":
            with torch.no_grad():
                model(*x)
            return
        model.zero_grad(set_to_none=True)
        outs = flatten_tensors(model(*x))
        if not gs:
            gs.extend(torch.randn(o.shape, device=dev) for o in outs)
        sum((o * g).sum() for o, g in zip(outs, gs, strict=True)).backward()  # type: ignore[union-attr]

    budget = float(min_run) * int(rounds)
    policy = TimingPolicy(min_samples=10, max_samples=10_000, target_rel_ci=1e-9, max_time_s=budget)
    m = measure(step, dev, policy)
    return {"median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "blocks": len(m.samples_ms)}


def _child(argv: list[str]) -> dict[str, Any]:
    import warnings
    from functools import partial

    import torch

    import advisor
    from advisor.allocator import settle_cpu_allocator
    from advisor.config import load_config
    from advisor.knobs import GlobalFlags
    from advisor.runner import flatten_tensors
    from advisor.timing import Measurement, Sampler, sample_interleaved
    from advisor.workload import workload_from_info

    warnings.simplefilter("ignore")
    settle_cpu_allocator()  # every variant timed from the allocator state of a training loop
    cfg_path, mode, device, variants_json, rounds, min_run = argv
    dev = torch.device(device)
    cfg = load_config(cfg_path)
    workload = workload_from_info(cfg.workload)
    x = workload.make_inputs(dev, seed=7)
    training = mode == "train"

    def loss(outs: list[torch.Tensor], gs: list[torch.Tensor]) -> torch.Tensor:
        return sum((o.float() * g).sum() for o, g in zip(outs, gs, strict=True))  # type: ignore[return-value]

    base = workload.make_model().to(dev).train(training)
    with torch.enable_grad():
        ref = flatten_tensors(base(*x))
    gen = torch.Generator().manual_seed(1)
    gs = [torch.randn(o.shape, generator=gen).to(dev) for o in ref]
    loss(ref, gs).backward()

    def flat_grads(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat(
            [p.grad.float().flatten() for p in model.parameters() if p.grad is not None]
        )

    ref_g = flat_grads(base)
    ref_out = torch.cat([o.float().flatten() for o in ref])
    runs: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for name, s in json.loads(variants_json).items():
        c = cfg.model_copy(update={"settings": advisor.Settings.model_validate(s)})
        tuned = advisor.apply(c, workload.make_model().train(training), device=dev)
        xt = tuned.inputs(*x)
        with tuned.autocast():
            got = flatten_tensors(tuned.model(*xt))
        loss(got, gs).backward()
        got_out = torch.cat([o.float().flatten() for o in got])
        out[name] = {
            "err": ((got_out - ref_out).norm() / ref_out.norm()).item(),
            "grad_err": ((flat_grads(tuned.model) - ref_g).norm() / ref_g.norm()).item()
            if training
            else None,
            "layers": {k: v for k, v in tuned.layer_impls.items() if v != "native"},
        }

        def step(tuned: Any = tuned, xt: tuple[Any, ...] = xt) -> None:
            if not training:
                with torch.no_grad(), tuned.autocast():
                    tuned.model(*xt)
                return
            tuned.model.zero_grad(set_to_none=True)
            with tuned.autocast():
                outs = flatten_tensors(tuned.model(*xt))
            loss(outs, gs).backward()

        runs[name] = (tuned, step)
        tuned.restore()

    names = list(runs)
    samples = sample_interleaved(
        [runs[n][1] for n in names],
        Sampler(dev),
        before=[partial(GlobalFlags.switch_to, runs[n][0].settings) for n in names],
        warmup=2,
        min_rounds=10,
        max_rounds=100_000,
        budget_s=float(min_run) * int(rounds),
    )
    for name, s in zip(names, samples, strict=True):
        m = Measurement(samples_ms=s)
        out[name].update(median_ms=m.median_ms, iqr_ms=m.iqr_ms, blocks=len(s))
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--plain":
        print(json.dumps(_plain_child(sys.argv[2:])))
    else:
        print(json.dumps(_child(sys.argv[1:])))
