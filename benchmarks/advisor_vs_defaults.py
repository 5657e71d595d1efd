"""PyTorch's default vs the advisor's pick vs "everything on", for the seeds' layers.

For each case the advisor tunes the layer (the full default search space for the device), saves
its config, and then a FRESH process applies that config with `advisor.apply` and re-times it
independently, interleaved with PyTorch's defaults and with switching everything on
(channels_last + AMP, plus TF32 and cudnn.benchmark on CUDA), all through the same `advisor.apply`
(fresh_retime.py). Prints a markdown table of ratios and writes it to --out.

    python benchmarks/advisor_vs_defaults.py --device cpu --out benchmarks/results/advisor_vs_defaults_cpu.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_retime import everything_on, retime_variants  # noqa: E402

# (name, layer, input shape on CPU, input shape on CUDA, mode) — the seeds' shapes, scaled to a CPU.
CASES = [
    (
        "seed: 3->16 conv on a big image",
        "Conv2d(3, 16, 3, padding=1)",
        "1,3,512,512",
        "1,3,1024,1024",
        "infer",
    ),
    (
        "seed: depthwise ConvTranspose2d 2x2/2",
        "ConvTranspose2d(256, 256, 2, stride=2, groups=256, bias=False)",
        "16,256,16,16",
        "64,2048,16,16",
        "infer",
    ),
    (
        "seed: Conv3d (1,3,3) train",
        "Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)",
        "2,2,50,64,64",
        "8,2,500,64,64",
        "train",
    ),
    (
        "seed: Conv2d 512->1024 (scaled)",
        "Conv2d(64, 128, 3)",
        "2,64,64,128",
        "5,512,128,256",
        "infer",
    ),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="markdown file to write the table to")
    ap.add_argument("--only", type=int, nargs="*", help="case indices to run")
    args = ap.parse_args()

    import torch

    import advisor

    env = advisor.current_environment(args.device)
    lines = [
        "# Advisor vs PyTorch defaults vs everything on",
        "",
        f"Device: {env.device_name} ({env.device_type}), {env.cpu_threads} threads; torch {env.torch}"
        f"; CUDA {env.cuda}; cuDNN {env.cudnn}; fingerprint {env.fingerprint}.",
        "Each setting applied with `advisor.apply` in one fresh process and timed with "
        "torch.utils.benchmark in 6 interleaved rounds (alternating order, >= 0.5 s per round); "
        "median ms; ratios are PyTorch default time / setting time. Everything on: "
        + ", ".join(f"{k}={v}" for k, v in everything_on(args.device).items())
        + ". Plain PyTorch: the untouched model in a bare loop in its own fresh process, without "
        "`advisor.apply` (on a CPU, apply also settles glibc malloc, as every measurement does: "
        "see advisor/device/allocator.py); advisor vs plain is what a user's script gains from "
        "`advisor.apply` as a whole.",
        "",
        "| case | mode | input | advisor's pick | plain PyTorch ms | default ms | advisor ms "
        "| everything-on ms | advisor vs plain | advisor vs default | everything-on vs default "
        "| tuning s |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    cuda = torch.device(args.device).type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, layer, cpu_shape, gpu_shape, mode) in enumerate(CASES):
            if args.only and i not in args.only:
                continue
            shape = gpu_shape if cuda else cpu_shape
            t0 = time.perf_counter()
            advice = advisor.advise(layer=layer, input_shape=shape, mode=mode, device=args.device)
            tuning = time.perf_counter() - t0
            cfg = Path(tmp) / f"case{i}.json"
            advice.save(cfg, trials_csv=False)
            variants = {
                "default": {},
                "advisor": advice.settings.model_dump(mode="json"),
                "everything_on": everything_on(args.device),
            }
            try:
                t = retime_variants(cfg, variants, mode, args.device, plain=True)
            except RuntimeError as e:
                print(f"| {name} | {mode} | {shape} | re-time failed: {e} |")
                continue
            p, d, a, e = (
                t[k]["median_ms"] for k in ("plain", "default", "advisor", "everything_on")
            )
            row = (
                f"| {name} | {mode} | {shape} | {advice.settings.label()} | {p:.3f} | {d:.3f} "
                f"| {a:.3f} | {e:.3f} | {p / a:.2f}x | {d / a:.2f}x | {d / e:.2f}x | {tuning:.0f} |"
            )
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
