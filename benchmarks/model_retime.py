"""Tune model files, then re-time each config independently in a fresh process.

For each model file: `advisor.advise` (train mode by default) writes a config; a FRESH process
applies PyTorch's default, the advisor's pick, "everything on" and (when the pick has per-layer
implementations) the pick without them, each with `advisor.apply` to its own copy of the model,
checks outputs and gradients against the untuned fp32 model, and times the steps interleaved with
`torch.utils.benchmark` (fresh_retime.py). Prints a markdown table and writes it to --out.

    python benchmarks/model_retime.py advisor/examples/video_cnn.py advisor/examples/small_cnn.py \
        --device cpu --out benchmarks/results/model_retime_cpu.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_retime import everything_on, retime_variants  # noqa: E402

NAMES = ("plain", "default", "advisor", "everything_on", "without_layers")


def _cell(v: dict[str, Any] | None) -> str:
    return f"{v['median_ms']:.2f} ({v['iqr_ms']:.2f})" if v else "-"


def _ratio(v: dict[str, Any] | None, advisor_: dict[str, Any]) -> str:
    return f"{v['median_ms'] / advisor_['median_ms']:.2f}x" if v else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--out")
    args = ap.parse_args()

    import advisor
    from advisor.knobs import Settings

    env = advisor.current_environment(args.device)
    lines = [
        "# Tuned model files re-timed in a fresh process",
        "",
        f"Device: {env.device_name} ({env.device_type}), {env.cpu_threads} threads; torch {env.torch}"
        f"; CUDA {env.cuda}; cuDNN {env.cudnn}; fingerprint {env.fingerprint}.",
        f"Mode: {args.mode}. Each setting applied with `advisor.apply` to its own copy of the model "
        "in one fresh process, then timed with torch.utils.benchmark in 6 interleaved rounds "
        "(alternating order, >= 0.5 s per round): median ms (IQR). Ratios are the other setting's "
        "time / the advisor's. Everything on: "
        + ", ".join(f"{k}={v}" for k, v in everything_on(args.device).items())
        + "; pick w/o layers: the advisor's global settings without its per-layer choices; "
        "plain: the untouched model in a bare loop in its own fresh process, without "
        "`advisor.apply` (which on a CPU also settles glibc malloc, as every measurement does). "
        "Errors: outputs / gradients relative to the untuned fp32 model.",
        "",
        "| model | advisor's pick | plain ms | default ms | advisor ms | everything-on ms "
        "| pick w/o layers ms | plain / advisor | default / advisor | everything-on / advisor "
        "| w/o layers / advisor | advisor error | tuning s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.models:
            t0 = time.perf_counter()
            advice = advisor.advise(model_file=target, mode=args.mode, device=args.device)
            tuning = time.perf_counter() - t0
            cfg = Path(tmp) / "tuned.json"
            advice.save(cfg, trials_csv=False)
            picked = advice.settings.model_dump(mode="json")
            variants = {
                "default": {},
                "advisor": picked,
                "everything_on": everything_on(args.device),
            }
            if advice.settings.layers:
                variants["without_layers"] = {**picked, "layers": {}}
            try:
                t = retime_variants(cfg, variants, args.mode, args.device, plain=True)
            except RuntimeError as e:
                print(f"| {target} | re-time failed: {e} |")
                continue
            label = advice.settings.label()
            if Settings.model_validate(variants["everything_on"]) == advice.settings:
                label += " (= everything on: that pair shows the noise)"
            cells = " | ".join(_cell(t.get(n)) for n in NAMES)
            ratios = " | ".join(_ratio(t.get(n), t["advisor"]) for n in NAMES if n != "advisor")
            a = t["advisor"]
            grad = f"{a['grad_err']:.1e}" if a["grad_err"] is not None else "-"
            row = (
                f"| {Path(target).name} | {label} | {cells} | {ratios} "
                f"| {a['err']:.1e} / {grad} | {tuning:.0f} |"
            )
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
