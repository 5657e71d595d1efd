"""The advisor's numeric gate, verdict by verdict, over several input draws of real networks.

For each model and each input seed, the gate (`advisor.gate.numeric.Gate`, as `advisor advise` builds it
from a space) judges: exact-fp32 channels_last, bf16 autocast, bf16 + channels_last, oneDNN's bf16
fp32 convs (`cpu_fp32=bf16`), and two conv implementations that are wrong on purpose (weights off
by 1e-3 relative; one kernel tap dropped, from tests/plugins/faulty_impls.py); the training check
behind the bf16 column (advisor/gate/precision.py) is shown beside: the learning rate kept, fp32's
loss from the start to the end, how far bf16's trained weights (evaluated in fp32) end behind it
and what that was judged against (1% of what fp32 learnt; the fp32 band where it was run), all
over the start, or "not judged" and why. Then the check's controls: its two negative controls
(tests/data/below_bf16.py in bf16, tests/data/fp16_overflow.py in fp16), which must be rejected on
every draw, and its positive control for issue 56 (tests/data/bottleneck_resnet.py in bf16: a
lag at an Adam step below bf16's half-ulp that is not a failure to train), which must be accepted
on every draw, as must `deep_bottleneck_resnet` (ResNet-50's depth, which learns the check's
batches nearly to nothing: bf16 trails there and is judged on held-out batches,
advisor/gate/held_out.py). A verdict that changes with the seed is the lottery this gate exists
to remove. Timing is minimal: only the verdicts matter here.

    python benchmarks/gate_verdicts.py [models...] [--seeds 5] [--space cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.execute.runner import Gate, evaluate  # noqa: E402
from advisor.knobs import Settings  # noqa: E402
from advisor.measure.timing import TimingPolicy  # noqa: E402
from advisor.space import load_space  # noqa: E402
from advisor.workload.build import model_workload  # noqa: E402

MODELS = [
    "small_cnn",
    "video_cnn",
    "relu_bn_block",
    "resnet18",
    "mobilenet_v3_small",
    "monai_unet3d",
]
EXAMPLES = ("small_cnn", "video_cnn")  # advisor/examples/; the others are benchmarks/models/
# Controls of the training check: (model file, the precision, whether it must be accepted).
CONTROLS = {
    "below_bf16": (ROOT / "tests" / "data" / "below_bf16.py", Settings(amp="bf16"), False),
    "fp16_overflow": (ROOT / "tests" / "data" / "fp16_overflow.py", Settings(amp="fp16"), False),
    "bottleneck_resnet": (
        ROOT / "tests" / "data" / "bottleneck_resnet.py",
        Settings(amp="bf16"),
        True,
    ),
    # ResNet-50's depth: learns the check's batches nearly to nothing, bf16 trailing there
    "deep_bottleneck_resnet": (
        ROOT / "tests" / "data" / "deep_bottleneck_resnet.py",
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


def _check(r) -> str:  # noqa: ANN001 - a TrialResult
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


def _cpu_name() -> str:
    """lscpu's model name with its family and model numbers (a VM may name only "AMD EPYC")."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name", platform.machine())
    return f"{name} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"


def _cell(r) -> str:  # noqa: ANN001 - a TrialResult
    if r.status == "ok":
        grad = f", grad {r.grad_error:.1e} <= {r.grad_tolerance:.1e}" if r.grad_error else ""
        return f"ok (out {r.rel_error:.1e}{grad})"
    if r.status == "rejected":
        c = r.precision_check
        if c is not None and not c.judged:
            return "**rejected**: not judged by its training check"
        by = (r.rejected_by or "").split("=")[0] or "its training check (Inf or NaN)"
        return f"**rejected** by {by}"
    return f"failed: {r.reason}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=MODELS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--space", default="cpu")
    p.add_argument("--mode", default="train", choices=["train", "infer"])
    p.add_argument("--out", help="also write the markdown here")
    p.add_argument("--no-controls", dest="controls", action="store_false",
                   help="leave out the training check's negative controls")  # fmt: skip
    args = p.parse_args(argv)
    from tests.plugins import faulty_impls  # registers test_scaled and test_tap

    faulty_impls.register_all()
    cpu = torch.device("cpu")
    space = load_space(args.space, cpu)
    lines = [
        "# Numeric-gate verdicts over input draws",
        "",
        f"Machine: {_cpu_name()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; space `{space.name}`, mode {args.mode}.",
        f"Command: `python benchmarks/gate_verdicts.py {' '.join(argv or sys.argv[1:])}`",
        "",
    ]
    for name in args.models:
        where = ("advisor", "examples") if name in EXAMPLES else ("benchmarks", "models")
        path = ROOT.joinpath(*where, f"{name}.py")
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
            cells = [_cell(r) for r in results.values()] + [_check(results["bf16"])]
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
                lines.append(f"| {name} | {settings.amp} | {must} | {seed} | {_cell(r)} | "
                             f"{_check(r)} |")  # fmt: skip
                print(f"{name} seed {seed}: {r.status}", file=sys.stderr)
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
