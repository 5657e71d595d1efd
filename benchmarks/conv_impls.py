"""Time every applicable conv implementation against `native`, forward and forward+backward.

    python benchmarks/conv_impls.py [--device cpu|cuda] [--quick] [--out FILE.md]

Layers: the seeds' shapes (scaled down on CPU) and common CNN layers. Each (layer, impl, mode) is
warmed up, then sampled (synchronised, fresh random inputs from a small pool, parameter grads
cleared outside the timed region) until ~0.3 s or 50 samples; raw samples are kept and reported as
median and IQR. Every impl's forward is also checked against native (relative error).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor import impls  # noqa: E402
from advisor.device.allocator import settle_cpu_allocator  # noqa: E402
from advisor.impls.base import ConvSignature  # noqa: E402
from advisor.measure import roofline
from advisor.measure.timing import Sampler, sample_interleaved  # noqa: E402


@dataclass(frozen=True)
class Layer:
    name: str
    make: Callable[[], nn.Module]
    cpu_shape: tuple[int, ...]
    cuda_shape: tuple[int, ...]
    channels_last: bool = False


def _cl(layer: Layer) -> Layer:
    return Layer(layer.name + " [CL]", layer.make, layer.cpu_shape, layer.cuda_shape, True)


RESNET_3X3 = Layer(
    "ResNet 3x3 64->64", lambda: nn.Conv2d(64, 64, 3, padding=1, bias=False),
    (4, 64, 28, 28), (32, 64, 56, 56),
)  # fmt: skip
RESNET_1X1 = Layer(
    "ResNet 1x1 256->64", lambda: nn.Conv2d(256, 64, 1, bias=False),
    (4, 256, 28, 28), (32, 256, 56, 56),
)  # fmt: skip
DEPTHWISE_T = Layer(
    "seed: depthwise ConvT2d 2x2 s2 (256 ch)",
    lambda: nn.ConvTranspose2d(256, 256, 2, stride=2, groups=256),
    (8, 256, 16, 16), (64, 256, 16, 16),
)  # fmt: skip

LAYERS: list[Layer] = [
    Layer(
        "seed: Conv3d (1,3,3) 2->2",
        lambda: nn.Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False),
        (2, 2, 50, 64, 64), (8, 2, 500, 64, 64),
    ),
    DEPTHWISE_T,
    _cl(DEPTHWISE_T),
    Layer(
        "seed: Conv2d 3->16 3x3", lambda: nn.Conv2d(3, 16, 3, padding=1),
        (1, 3, 512, 512), (1, 3, 1024, 1024),
    ),
    Layer(
        "seed: Conv2d 64->128 3x3", lambda: nn.Conv2d(64, 128, 3, padding=1),
        (1, 64, 64, 128), (5, 512, 128, 256),
    ),
    RESNET_3X3,
    _cl(RESNET_3X3),
    RESNET_1X1,
    _cl(RESNET_1X1),
    Layer(
        "depthwise 3x3 (128 ch)", lambda: nn.Conv2d(128, 128, 3, padding=1, groups=128),
        (4, 128, 28, 28), (32, 128, 56, 56),
    ),
    Layer(
        "strided 3x3 s2 64->128", lambda: nn.Conv2d(64, 128, 3, stride=2, padding=1),
        (4, 64, 28, 28), (32, 64, 56, 56),
    ),
    Layer(
        "dilated 3x3 d2 64->64", lambda: nn.Conv2d(64, 64, 3, padding=2, dilation=2),
        (4, 64, 28, 28), (32, 64, 56, 56),
    ),
    Layer(
        "ConvT2d 3x3 s2 64->32",
        lambda: nn.ConvTranspose2d(64, 32, 3, stride=2, padding=1, output_padding=1),
        (4, 64, 14, 14), (32, 64, 28, 28),
    ),
    Layer(
        "Conv1d k5 64->64", lambda: nn.Conv1d(64, 64, 5, padding=2),
        (8, 64, 512), (64, 64, 4096),
    ),
    Layer(
        "Conv3d 3x3x3 16->16", lambda: nn.Conv3d(16, 16, 3, padding=1),
        (1, 16, 8, 28, 28), (8, 16, 16, 56, 56),
    ),
]  # fmt: skip
QUICK = [0, 1, 3, 5, 7]


@dataclass
class Row:
    layer: str
    impl: str
    mode: str
    samples_ms: list[float] = field(default_factory=list)
    err: float = float("nan")
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def iqr(self) -> float:
        if len(self.samples_ms) < 4:
            return float("nan")
        q = statistics.quantiles(self.samples_ms, n=4)
        return q[2] - q[0]


def _steps(
    module: nn.Module, pool: list[torch.Tensor], grad_out: torch.Tensor
) -> dict[str, tuple[Callable[[int], None], Callable[[], None]]]:
    """mode -> (step(i), clear()): clear runs before each sample, outside the timed region."""
    inputs = [x.clone().requires_grad_() for x in pool]

    def infer(i: int) -> None:
        with torch.no_grad():
            module(pool[i % len(pool)])

    def train(i: int) -> None:
        module(inputs[i % len(inputs)]).backward(grad_out)

    def clear() -> None:
        module.zero_grad(set_to_none=True)
        for x in inputs:
            x.grad = None

    return {"infer": (infer, clear), "train": (train, clear)}


def _interleaved(
    steps: dict[str, tuple[Callable[[int], None], Callable[[], None]]],
    device: torch.device,
    budget_s: float,
) -> dict[str, list[float]]:
    """Samples (ms) per impl from the advisor's one interleaving sampler (A B C, C B A, ...):
    2 warm-up runs each, 5 to 40 rounds, about budget_s per impl; `clear` before each call."""
    counters = {name: itertools.count() for name in steps}
    calls = [lambda s=s, c=counters[n]: s(next(c)) for n, (s, _) in steps.items()]
    samples = sample_interleaved(
        calls,
        Sampler(device),
        before=[clear for _, clear in steps.values()],
        warmup=2,
        min_rounds=5,
        max_rounds=40,
        budget_s=budget_s,
    )
    return dict(zip(steps, samples, strict=True))


def bench_layer(layer: Layer, device: torch.device, budget_s: float) -> list[Row]:
    torch.manual_seed(0)
    shape = layer.cuda_shape if device.type == "cuda" else layer.cpu_shape
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape))
    base = layer.make().to(device)
    if layer.channels_last and fmt is not None:
        base = base.to(memory_format=fmt)
    sig = ConvSignature.from_module(base)

    def fresh() -> torch.Tensor:
        x = torch.randn(shape, device=device)
        return x.to(memory_format=fmt) if layer.channels_last and fmt is not None else x

    pool = [fresh() for _ in range(3)]  # fresh inputs, rotated; made outside the timed region
    with torch.no_grad():
        reference = base(pool[0])
    grad_out = torch.randn_like(reference)
    rows: list[Row] = []
    runnable: dict[str, dict] = {}
    errors: dict[str, float] = {}
    for name in impls.names():
        reason = impls.get_impl(name).why_not(sig, device=device, dtype=torch.float32)
        if reason is not None:
            rows.append(Row(layer.name, name, "-", note=reason))
            continue
        module = impls.swap(copy.deepcopy(base), name)
        with torch.no_grad():
            out = module(pool[0])
        errors[name] = ((out - reference).norm() / reference.norm()).item()
        runnable[name] = _steps(module, pool, grad_out)
    for mode in ("infer", "train"):
        steps = {name: by_mode[mode] for name, by_mode in runnable.items()}
        for name, samples in _interleaved(steps, device, budget_s).items():
            rows.append(Row(layer.name, name, mode, samples, errors[name]))
    return rows


def environment(device: torch.device, peaks: roofline.Peaks) -> list[str]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    lines = [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- torch {torch.__version__}, triton {triton_version}, python {platform.python_version()}",
        f"- CPU: {cpu}; torch threads: {torch.get_num_threads()}; "
        f"load average at start: {', '.join(f'{v:.1f}' for v in os.getloadavg())} "
        f"(on {os.cpu_count()} cores: other processes share the machine when this exceeds ~0)",
    ]
    if device.type == "cuda":
        lines.append(f"- GPU: {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}")
    lines.append(
        f"- measured peaks ({device.type}, fp32): {peaks.flops_per_s / 1e9:.1f} GFLOP/s matmul, "
        f"{peaks.bytes_per_s / 1e9:.1f} GB/s copy"
    )
    return lines


def table(rows: list[Row], layers: list[Layer], device: torch.device, peaks: roofline.Peaks) -> str:
    head = (
        "| layer | input | impl | mode | median ms | IQR ms | n | speedup vs native "
        "| roofline | rel err vs native |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    out = [head]
    skipped = []
    by_layer = {layer.name: layer for layer in layers}
    native = {(r.layer, r.mode): r.median for r in rows if r.impl == "native"}
    for r in rows:
        if r.note:
            skipped.append(f"- {r.layer}: `{r.impl}` not applicable: {r.note}")
            continue
        layer = by_layer[r.layer]
        shape = layer.cuda_shape if device.type == "cuda" else layer.cpu_shape
        sig = ConvSignature.from_module(layer.make())
        train = r.mode == "train"
        frac = roofline.roofline_fraction(
            r.median / 1e3,
            roofline.conv_flops(sig, shape, train),
            roofline.conv_min_bytes(sig, shape, torch.float32, train),
            peaks,
        )
        speedup = native[(r.layer, r.mode)] / r.median
        out.append(
            f"| {r.layer} | {'x'.join(map(str, shape))} | {r.impl} | {r.mode} | {r.median:.3f} "
            f"| {r.iqr:.3f} | {len(r.samples_ms)} | {speedup:.2f}x | {frac:.1%} | {r.err:.1e} |"
        )
    return "\n".join(out + ["", "Not applicable:", "", *skipped])


def warnings(rows: list[Row], device: torch.device, peaks: roofline.Peaks) -> list[str]:
    """Say so when the figures cannot be trusted: wide spreads, or beating the measured peak
    (which means the peaks were measured while something else loaded the machine)."""
    timed = [r for r in rows if r.samples_ms]
    noisy = [r for r in timed if r.iqr > 0.5 * r.median]
    out = []
    if noisy:
        out.append(
            f"WARNING: {len(noisy)} of {len(timed)} rows have IQR > 50% of the median: the "
            "machine was busy; treat ratios within the spread as ties and re-run on an idle one."
        )
    load = os.getloadavg()[0]
    if device.type == "cpu" and load > 0.5 * (os.cpu_count() or 1):
        out.append(f"WARNING: load average {load:.1f} at the end on {os.cpu_count()} cores.")
    return ["", *out] if out else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="five layers, shorter sampling")
    ap.add_argument("--out", help="also write the markdown to this file")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    settle_cpu_allocator()  # CPU: timed from the allocator state of a training loop
    layers = [LAYERS[i] for i in QUICK] if args.quick else LAYERS
    budget = 0.1 if args.quick else 0.3
    peaks = roofline.measure_peaks(device)
    header = ["# Conv implementations vs native", "", *environment(device, peaks), ""]
    print("\n".join(header), flush=True)
    started = time.perf_counter()
    rows: list[Row] = []
    for layer in layers:
        rows.extend(bench_layer(layer, device, budget))
        print(f"  done: {layer.name}", file=sys.stderr, flush=True)
    notes = [
        "",
        f"Total benchmark time: {time.perf_counter() - started:.0f} s. 'speedup' = native median "
        "/ impl median (>1 is faster); roofline = max(FLOPs/peak, bytes/bandwidth) / median; "
        "train = forward + backward (input, weight and bias grads). [CL] = channels_last.",
    ]
    notes += warnings(rows, device, peaks)
    text = "\n".join([*header, table(rows, layers, device, peaks), *notes]) + "\n"
    print("\n".join([table(rows, layers, device, peaks), *notes]))
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
