"""The GPU audit's findings on a real GPU (../shared/gpu_audit.md #1, #3, #4, #5, #6, #7): run
where a CUDA device is lent, skipped elsewhere. Their CPU twins run everywhere through the CUDA
stand-in (tests/test_cuda_standin.py, tests/test_gpu_sampling.py, tests/test_dropout_gate.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import advisor
from advisor.config import load_config
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.measure.canonical_dropout import canonical_dropout
from advisor.measure.gpu_clock import l2_flusher
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import measure
from advisor.space import SearchSpace
from advisor.workload.args import make_workload
from advisor.workload.build import model_workload
from tests._cli import advisor_cli
from tests.conftest import DATA, run_env

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
QUICK_SPACE = str(DATA / "cuda_quick.yaml")
ROOT = Path(__file__).resolve().parents[2]
QUICK_TIMING = {"warmup_runs": 2, "warmup_s": 0.05, "min_samples": 5, "max_samples": 20,
                "max_time_s": 0.3, "min_sample_ms": 1.0}  # fmt: skip


def _space(**extra: object) -> SearchSpace:
    return SearchSpace.model_validate(
        {"name": "gpu-test", "device": "cuda", "knobs": {}, "timing": QUICK_TIMING, **extra}
    )


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_cli_advise_runs_isolated_on_the_gpu(tmp_path: Path, device: str) -> None:
    # #1: the worker passed a bare "cuda" to torch.cuda.set_device, which raises: every trial
    # of the CLI's default (isolated) path failed and advise aborted.
    out = tmp_path / "tuned.json"
    r = advisor_cli("advise", str(DATA / "tiny_cnn.py"), "--device", device, "--mode", "train",
                    "--space", QUICK_SPACE, "--storage", "memory", "--out", str(out), "--quiet",
                    timeout=540)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = load_config(out)
    assert cfg.environment.device_type == "cuda" and cfg.result is not None


def _suite_cases() -> list:  # noqa: ANN202 - benchmarks.registry.Model
    """The benchmarks' seeds and full-size networks that are measured in training."""
    from benchmarks.registry import BY_NAME, SETS

    return [BY_NAME[n] for s in ("seeds", "large") for n in SETS[s] if "train" in BY_NAME[n].modes]


@pytest.mark.parametrize("case", _suite_cases(), ids=lambda c: c.name)
def test_the_default_is_accepted_on_every_suite_model(case) -> None:  # noqa: ANN001
    # #3: on CUDA PyTorch's default computes convs in TF32; where that differs from fp32 beyond
    # the space's TF32 tolerances the default was "rejected" and advise raised.
    if case.missing():
        pytest.skip(case.missing())
    target = case.target("cuda")  # the file, and its factories at the seed's own size
    named = dict(zip(target[1::2], target[2::2], strict=True))
    workload = model_workload(str(case.path), build=named.get("--build", "build_model"),
                              inputs=named.get("--inputs", "example_inputs"))  # fmt: skip
    space = SearchSpace.model_validate(
        {
            **_space().model_dump(),
            "tolerances": {"tf32": 1e-6},
            "grad_tolerances": {"tf32": 1e-6},
            "layer_tolerances": {"tf32": 1e-6},
        }
    )  # fmt: skip  (tolerances far below TF32's error: only the default-path rule can accept)
    gate = Gate(workload, CUDA, "train", space)
    result = evaluate(workload, Settings(), CUDA, "train", space, gate)
    assert result.status == "ok", result.reason
    assert "default path" in (result.tolerance_basis or "")


FRESH = """
import sys, torch
from advisor.measure.candidate import Candidate
from advisor.knobs import Settings
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import measure
from advisor.workload.args import make_workload
from advisor.workload.build import model_workload
layer, shape, bench = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
w = make_workload(layer=layer, input_shape=shape)
c = Candidate(w, Settings(cudnn_benchmark=bench), torch.device("cuda"), "train")
m = measure(c.step, torch.device("cuda"), TimingPolicy(min_samples=20, max_time_s=2.0))
print(m.median_ms)
"""


def test_cudnn_benchmark_inside_the_advisor_matches_fresh_processes(tmp_path: Path) -> None:
    # #4: cuDNN's plan cache outlives a candidate and ignores the benchmark flag: in one process
    # benchmark=True reused the heuristic plans of its False twin. Each value now has a
    # process of its own; its effect must be what two fresh processes show.
    layer, shape = "Conv3d(64, 64, (1, 3, 3), padding=(0, 1, 1))", "8,64,16,56,56"
    space = _space(knobs={"cudnn_benchmark": [False, True]}, race=False, per_layer=False)
    path = tmp_path / "bench.json"
    path.write_text(space.model_dump_json())
    advice = advisor.advise(layer=layer, input_shape=shape, mode="train", device="cuda",
                            space=str(path), storage="memory")  # fmt: skip
    by = {row.label: row.median_ms for row in advice.trials.itertuples()}
    inside = by["default"] / by["cudnn_benchmark=on"]
    fresh = []
    for bench in ("0", "1", "0", "1"):
        r = subprocess.run([sys.executable, "-c", FRESH, layer, shape, bench], env=run_env(),
                           capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        fresh.append(float(r.stdout.split()[-1]))
    outside = math.sqrt(fresh[0] * fresh[2]) / math.sqrt(fresh[1] * fresh[3])
    assert abs(math.log(inside / outside)) < math.log(1.15), (inside, outside, fresh)


def _dropout_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Dropout(0.2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(32 * 16, 64), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(64, 10),
    )  # fmt: skip


def test_amp_is_accepted_on_a_model_with_dropout() -> None:
    # #5: CUDA draws dropout masks with a dtype-dependent vector width, so AMP and its yardstick
    # were compared with the fp32 reference under other masks: "fp16 is not accepted here".
    x = torch.randn(16, 3, 32, 32)
    torch.manual_seed(0)
    plain = torch.nn.functional.dropout(torch.ones(4096, device="cuda"), 0.5)
    torch.manual_seed(0)
    half = torch.nn.functional.dropout(torch.ones(4096, device="cuda", dtype=torch.half), 0.5)
    same = []
    for d in (torch.float32, torch.half):  # each a step of its own: masks follow the call number
        with canonical_dropout(0):
            same.append(torch.nn.functional.dropout(torch.ones(4096, device="cuda", dtype=d), 0.5))
    assert torch.equal(same[0] != 0, same[1] != 0)
    print("PyTorch's own masks equal across dtypes:", torch.equal(plain != 0, half != 0))
    workload = make_workload(model=_dropout_net(), inputs=(x,))
    space = _space()
    gate = Gate(workload, CUDA, "train", space)
    for settings in (Settings(amp="fp16"), Settings(amp="bf16"),
                     Settings(amp="fp16", memory_format="channels_last")):  # fmt: skip
        result = evaluate(workload, settings, CUDA, "train", space, gate)
        assert result.status == "ok", (settings.label(), result.reason)


def test_per_layer_fp16_train_samples_are_the_devices_time() -> None:
    # #6: GradScaler.step syncs (.item()), so the calls queued ahead of a busy GPU were launched
    # one by one after it: the sample timed the host. Compared with the profiler's kernel time.
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    workload = make_workload(layer="Conv2d(64, 64, 3, padding=1)", input_shape="32,64,56,56")
    cand = Candidate(workload, Settings(amp="fp16"), CUDA, "train")
    try:
        m = measure(cand.step, CUDA, TimingPolicy(min_samples=20, max_time_s=1.0, min_sample_ms=1.0),
                    flush=l2_flusher(CUDA), queue_ahead=True)  # fmt: skip
        steps = 10
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                cand.step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        kernel_ms = sum(getattr(e, "device_time", 0.0) for e in kernels) / 1e3 / steps
    finally:
        cand.close()
    assert 0.8 < m.median_ms / kernel_ms < 1.3, (m.median_ms, kernel_ms)


def test_peak_memory_of_a_tiny_layer_leaves_out_the_harness() -> None:
    # #7: the 100 MiB L2 flush buffer (and a first call's autotuning buffers) were counted.
    workload = make_workload(layer="Conv2d(8, 8, 3, padding=1)", input_shape="1,8,16,16")
    space = _space()
    result = evaluate(workload, Settings(), CUDA, "infer", space,
                      Gate(workload, CUDA, "infer", space))  # fmt: skip
    assert result.status == "ok" and result.peak_memory_mb is not None
    assert result.peak_memory_mb < 20
