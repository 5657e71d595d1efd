"""Does a win measured in one process hold in the next? One change against PyTorch's default,
re-timed interleaved in several fresh processes of the same model.

The advisor decides from one process: its interleaved re-time gives the change's speedup with an
interval, and the change is recommended when that interval excludes 1.0x. If fresh processes of
the same model disagree beyond those intervals (memory layout, thread pools, the allocator's
state differ from process to process), a small win can be recommended by one run and refused by
the next. This script measures that spread: per process, the speedup (default median / change
median) with the advisor's conservative interval (`advisor.measure.stats.speedup`), and whether the
interval excludes 1.0x.

    python benchmarks/process_spread.py --models relu_bn_block small_cnn --processes 6 \
        --change '{"memory_format": "channels_last"}' --out benchmarks/results/process_spread_cpu.md
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_retime import retime_variants  # noqa: E402


def _config(model: Path, mode: str, device: str, into: Path) -> Path:
    """A config naming the model (its settings are not used: the variants say what to apply)."""
    import torch

    import advisor
    from advisor.config import Config, save_config
    from advisor.device.environment import current_environment
    from advisor.knobs import Settings
    from advisor.workload.build import model_workload

    cfg = Config(
        advisor_version=advisor.__version__,
        mode=mode,  # type: ignore[arg-type]
        settings=Settings(),
        environment=current_environment(torch.device(device)),
        workload=model_workload(str(model)).info.model_dump(mode="json"),
        space="none",
    )
    return save_config(cfg, into / f"{model.stem}.json")


def _speedup(default: dict[str, Any], change: dict[str, Any]) -> tuple[float, float, float]:
    from advisor.measure.stats import Measurement, speedup

    return speedup(
        Measurement(samples_ms=default["samples_ms"]), Measurement(samples_ms=change["samples_ms"])
    )


def main() -> int:
    from zoo import MODELS  # the zoo's model list: one place names the benchmark models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True, help="zoo names")
    ap.add_argument("--change", default='{"memory_format": "channels_last"}', help="settings JSON")
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", help="markdown file (raw samples beside it, .json)")
    args = ap.parse_args()
    change = json.loads(args.change)
    paths = {m.name: m.path for m in MODELS}
    unknown = [m for m in args.models if m not in paths]
    if unknown:
        raise SystemExit(f"process_spread: unknown model(s) {unknown}; see zoo.py --list")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    data: dict[str, Any] = {"change": change, "mode": args.mode, "device": args.device, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            cfg = _config(paths[name], args.mode, args.device, Path(tmp))
            runs = []
            for k in range(args.processes):
                t = retime_variants(cfg, {"default": {}, "change": change}, args.mode,
                                    args.device, rounds=args.rounds)  # fmt: skip
                s, lo, hi = _speedup(t["default"], t["change"])
                runs.append({"speedup": s, "low": lo, "high": hi,
                             "default_ms": t["default"]["median_ms"],
                             "change_ms": t["change"]["median_ms"],
                             "default_samples": t["default"]["samples_ms"],
                             "change_samples": t["change"]["samples_ms"]})  # fmt: skip
                print(f"{name} process {k + 1}: {s:.3f}x [{lo:.3f}, {hi:.3f}]", flush=True)
            data["runs"][name] = runs
    text = render(data, started, " ".join(sys.argv[1:]))
    print(text)
    if args.out:
        out = Path(args.out)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    return 0


def render(data: dict[str, Any], started: str, argv: str) -> str:
    import torch

    lines = [
        "# One change against the default, in several fresh processes",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        f"threads; torch {torch.__version__}; Python {platform.python_version()}; {started}.",
        "",
        f"Command: `python benchmarks/process_spread.py {argv}`",
        "",
        f"Change: `{json.dumps(data['change'])}`, mode {data['mode']}, device {data['device']}. "
        "Each process: default and change interleaved (fresh_retime.py); speedup = default "
        "median / change median, interval from the two 95% CIs (advisor.measure.stats.speedup), as the "
        "advisor's pick rule uses it.",
        "",
        "| model | per process: speedup [interval] | median | min-max | excludes 1.0x |",
        "| --- | --- | ---: | --- | ---: |",
    ]
    for name, runs in data["runs"].items():
        cells = ", ".join(f"{r['speedup']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" for r in runs)
        s = [r["speedup"] for r in runs]
        wins = sum(r["low"] > 1.0 for r in runs)
        losses = sum(r["high"] < 1.0 for r in runs)
        lines.append(
            f"| {name} | {cells} | {statistics.median(s):.2f}x | {min(s):.2f}-{max(s):.2f}x | "
            f"{wins} faster, {losses} slower of {len(runs)} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
