"""What the training check's fp32 side costs, and which of its runs sets the band.

For each model and input draw, the fp32 side of a precision's training check
(`advisor.gate.precision.fp32_runs`: the learning-rate probe, the reference, and the band's
runs) is trained with every band run the space allows switched on (`--jitter-runs`,
`--batch-runs`), and timed. The table shows its seconds, the learning rate the reference kept,
each band run's gap (its largest loss difference from the reference per pass, over the
reference's first) and which run set the band. A band run that never sets it is time the check
can save: the band is the widest of its runs, so leaving one out can only narrow it (reject
more, never accept more).

    python benchmarks/check_cost.py [models...] [--seeds 3] [--out FILE]

The models are the zoo's (benchmarks/zoo.py --list). Run it alone on the machine: it times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from zoo import MODELS  # noqa: E402

from advisor.device.environment import current_environment  # noqa: E402
from advisor.gate.precision import _gap, fp32_runs  # noqa: E402
from advisor.space import load_space  # noqa: E402
from advisor.workload.build import model_workload  # noqa: E402

DEFAULT_MODELS = [m.name for m in MODELS if not m.cuda_only]


def _row(name: str, seed: int, seconds: float, lr: float, gaps: dict[str, float]) -> str:
    widest = max(gaps, key=lambda k: gaps[k]) if gaps else "-"
    cells = " | ".join(f"{v:.3%}" for v in gaps.values())
    return f"| {name} | {seed} | {seconds:.1f} | {lr:g} | {cells} | {widest} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--space", default="cpu")
    ap.add_argument("--jitter-runs", type=int, default=1)
    ap.add_argument("--batch-runs", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    known = {m.name: m.path for m in MODELS}
    unknown = [m for m in args.models if m not in known]
    if unknown:
        print(f"check_cost: unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}",
              file=sys.stderr)  # fmt: skip
        return 2
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
        f"Command: `python benchmarks/check_cost.py {' '.join(argv or sys.argv[1:])}`",
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
            gaps = {k: _gap(side.runs[k], ref, side.cfg.batches, side.starts.get(k, side.start),
                            side.start) for k in band_runs}  # fmt: skip
            lines.append(_row(name, seed, seconds, side.cfg.lr, gaps))
            print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
