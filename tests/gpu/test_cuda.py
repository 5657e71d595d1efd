"""GPU-only tests: run on a CUDA machine (skipped elsewhere by the `gpu` marker)."""

from __future__ import annotations

import pytest
import torch

import advisor
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import GlobalFlags, Settings
from advisor.measure.gpu_clock import l2_flusher
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import measure
from advisor.space import load_space
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from tests.conftest import run_env

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda") if torch.cuda.is_available() else None


def test_tf32_setting_changes_conv_numerics() -> None:
    x = torch.randn(8, 64, 32, 32, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda")
    ref = torch.nn.functional.conv2d(x.double(), w.double()).float()
    errs = {}
    for tf32 in ("off", "conv"):
        with GlobalFlags() as flags:
            flags.apply(Settings(tf32=tf32))
            out = torch.nn.functional.conv2d(x, w)
        errs[tf32] = ((out - ref).norm() / ref.norm()).item()
    assert errs["off"] < 1e-5
    if torch.cuda.get_device_capability()[0] >= 8:
        assert errs["conv"] > 10 * errs["off"]  # TF32 really is on


def test_cuda_event_timing_with_l2_flush() -> None:
    x = torch.randn(2048, 2048, device="cuda")
    m = measure(
        lambda: x @ x, CUDA, TimingPolicy(min_samples=10, max_time_s=0.5), flush=l2_flusher(CUDA)
    )
    assert len(m.samples_ms) >= 10 and m.median_ms > 0
    assert m.first_call_ms is not None


def test_advise_layer_on_cuda(tmp_path) -> None:
    advice = advisor.advise(
        layer="Conv2d(64, 64, 3, padding=1)",
        input_shape="16,64,56,56",
        device="cuda",
        trials=12,
        storage="memory",
    )
    df = advice.trials
    assert df.iloc[0]["label"] == "default"
    assert (df[df["status"] == "ok"]["rel_error"] <= df[df["status"] == "ok"]["tolerance"]).all()
    path = advice.save(tmp_path / "t.json")
    model = torch.nn.Conv2d(64, 64, 3, padding=1)
    with advisor.apply(path, model) as tuned:
        assert next(tuned.model.parameters()).is_cuda
        assert torch.backends.cudnn.benchmark == advice.settings.cudnn_benchmark


def test_fp16_amp_gate_on_cuda() -> None:
    w = layer_workload(layer_spec("Conv2d(32, 32, 3, padding=1)", input_shape="8,32,32,32"))
    space = load_space("cuda", CUDA)
    gate = Gate(w, CUDA, "train", space)
    r = evaluate(w, Settings(amp="fp16", memory_format="channels_last"), CUDA, "train", space, gate)
    assert r.status == "ok", r.reason
    assert 1e-5 < r.rel_error < space.tolerances.fp16


def test_triton_impl_matches_cudnn() -> None:
    from advisor import impls

    conv = torch.nn.Conv2d(32, 64, 3, padding=1).cuda()
    x = torch.randn(4, 32, 28, 28, device="cuda")
    if impls.why_not("triton", conv, device=CUDA, dtype=torch.float32) is not None:
        pytest.skip("triton cannot run this layer here")
    ref = conv(x)
    with GlobalFlags() as flags:
        flags.apply(Settings(tf32="off"))
        tri = impls.swap(conv, "triton")
        out = tri(x)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-3


def test_fp16_training_of_a_model_passes_the_gate_with_its_scaler() -> None:
    from advisor.measure.candidate import Candidate
    from advisor.workload.build import model_workload
    from tests.conftest import DATA

    w = model_workload(str(DATA / "relu_bn_block.py"))
    space = load_space("cuda", CUDA)
    gate = Gate(w, CUDA, "train", space)
    r = evaluate(w, Settings(amp="fp16", memory_format="channels_last"), CUDA, "train", space, gate)
    assert r.status == "ok", r.reason
    cand = Candidate(w, Settings(amp="fp16"), CUDA, "train")
    try:
        for _ in range(3):
            cand.step()
        assert cand.tuned.scaler.state_dict()["_growth_tracker"] == 3  # no overflow, 3 updates
    finally:
        cand.close()


def test_events_time_the_measured_device_not_the_current_one() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: with one, no other device can be the current one")
    torch.cuda.set_device(0)
    dev = torch.device("cuda:1")
    x = torch.randn(4096, 4096, device=dev)
    m = measure(lambda: x @ x, dev, TimingPolicy(min_samples=5, max_time_s=0.5))
    assert torch.cuda.current_device() == 0  # the guard put it back
    # 2 x 4096^3 flop: at least ~0.1 ms on any GPU; events on device 0 would read ~0
    assert m.median_ms > 0.1


def test_per_layer_samples_are_device_time_with_back_to_back_reps() -> None:
    """A tiny layer: one launch per sample times the host's launch latency; with the L2 flush,
    the GPU held while the calls are queued and several calls per sample, the sample is the
    device's time per call, which is shorter."""
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).cuda()
    x = torch.randn(1, 16, 16, 16, device="cuda")

    def step() -> None:
        with torch.no_grad():
            conv(x)

    policy = TimingPolicy(min_samples=20, max_samples=50, max_time_s=0.5, min_sample_ms=1.0)
    per_layer = measure(step, CUDA, policy, flush=l2_flusher(CUDA), queue_ahead=True)
    single = measure(step, CUDA, TimingPolicy(min_samples=20, max_samples=50, max_time_s=0.5))
    assert per_layer.reps > 1 and single.reps == 1
    assert per_layer.median_ms < single.median_ms


def test_triton_kernels_compiled_match_cudnn_in_every_precision() -> None:
    from advisor import impls
    from advisor.impls.triton_conv import interpreting

    if interpreting():
        pytest.skip("TRITON_INTERPRET=1: the kernels would be interpreted, not compiled")
    conv = torch.nn.Conv3d(32, 32, (1, 3, 3), padding=(0, 1, 1)).cuda()  # the seed's shape kind
    tol = {"fp32": 1e-5, "tf32": 3e-3, "fp16": 5e-3, "bf16": 2e-2}
    for name, tf32, amp in (("fp32", "off", None), ("tf32", "on", None),
                            ("fp16", "off", torch.float16), ("bf16", "off", torch.bfloat16)):  # fmt: skip
        x = torch.randn(2, 32, 4, 28, 28, device="cuda", requires_grad=True)
        g = torch.randn(2, 32, 4, 28, 28, device="cuda")
        outs = {}
        for impl in ("native", "triton"):
            with GlobalFlags() as flags:
                flags.apply(Settings(tf32=tf32))
                m = impls.swap(conv, impl)
                with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                    y = m(x)
                gx, gw = torch.autograd.grad(y, [x, m.weight], g)
            outs[impl] = (y.float(), gx.float(), gw.float())
        impls.swap(conv, "native")
        for a, b in zip(outs["triton"], outs["native"], strict=True):
            assert ((a - b).norm() / b.norm()).item() < tol[name], name


def test_inductor_starts_on_the_gpu_without_the_cpu_compilers_checks() -> None:
    # A GPU run's start compiles a Triton kernel; the C++ backend's instruction-set checks (most
    # of a CPU start) are never picked. A fresh process: another test may have started Inductor.
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from advisor.compiled import start_inductor\n"
        "from torch._inductor import cpu_vec_isa\n"
        "assert start_inductor(torch.device('cuda', 0)) > 0\n"
        "print(cpu_vec_isa.pick_vec_isa.cache_info().currsize)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=run_env())  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0"
