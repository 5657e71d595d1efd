"""GPU-only tests: run on a CUDA machine (skipped elsewhere by the `gpu` marker)."""

from __future__ import annotations

import pytest
import torch

import advisor
from advisor.knobs import GlobalFlags, Settings
from advisor.runner import Gate, evaluate
from advisor.space import load_space
from advisor.timing import TimingPolicy, l2_flusher, measure
from advisor.workload import layer_spec, layer_workload

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
