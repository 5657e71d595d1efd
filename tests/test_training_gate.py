"""What is timed and gated is what a training step does: the data gradient, fp16 with its
GradScaler, and a gate whose verdict does not depend on the input draw."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import advisor
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.measure.stopping import TimingPolicy
from advisor.space import load_space
from advisor.workload.build import layer_workload, model_workload
from advisor.workload.layer_spec import layer_spec
from tests.conftest import DATA

CPU = torch.device("cpu")
FP16 = str(DATA / "fp16_cpu.yaml")
RELU_BN = str(DATA / "relu_bn_block.py")
QUICK = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=3, max_samples=3, max_time_s=0.05)
CONV3D = "Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1))"


class ConvBackwards(TorchDispatchMode):
    """Counts convolution backward kernels by whether they compute the data gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.overloadpacket == torch.ops.aten.convolution_backward:
            mask = args[-1]
            self.calls["data+weight" if mask[0] else "weight only"] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("first_layer", [False, True])
def test_advise_on_a_conv3d_layer_in_train_mode_times_the_data_gradient(
    first_layer: bool, fast_space: str
) -> None:
    """Every backward the advisor runs for a layer computes the input gradient (the slow kernel
    of the seed's Conv3d thread), unless the layer is said to take the network's input."""
    with ConvBackwards() as counted:
        advice = advisor.advise(
            layer=CONV3D,
            input_shape="2,8,4,16,16",
            mode="train",
            device="cpu",
            space=fast_space,
            first_layer=first_layer,
        )
    assert advice.baseline.status == "ok"
    if first_layer:
        assert counted.calls["data+weight"] == 0 and counted.calls["weight only"] > 20
    else:
        assert counted.calls["weight only"] == 0 and counted.calls["data+weight"] > 20
    assert ("first layer" in advice.config.workload["description"]) == first_layer


def test_the_cli_takes_first_layer() -> None:
    from advisor.cli import build_parser
    from advisor.cli_args import workload_kwargs

    args = build_parser().parse_args(
        ["advise", "--layer", CONV3D, "--input-shape", "2,8,4,16,16", "--first-layer"]
    )
    assert workload_kwargs(args)["first_layer"] is True


def test_input_gradients_are_part_of_the_gate() -> None:
    w = layer_workload(layer_spec(CONV3D, input_shape="1,8,2,8,8"))
    gate = Gate(w, CPU, "train", load_space(FP16, CPU))
    assert "input.0" in gate.cases[0].grads
    r = evaluate(w, Settings(conv_impl="unfold_gemm"), CPU, "train", gate.space, gate, policy=QUICK)
    assert r.status == "ok" and r.layer_detail is not None


def _scaler_steps(cand: Candidate) -> int:
    scaler = cand.tuned.scaler
    assert scaler is not None
    return int(scaler.state_dict()["_growth_tracker"])


def test_fp16_training_step_includes_the_scaler_and_passes_the_gate(tmp_path: Path) -> None:
    """An fp16 candidate in training: the loss gradient has a real loss's scale, so the scaled
    backward does not overflow; the timed step runs scaler.step and scaler.update; its gradients
    are within the fp16 tolerance."""
    space = load_space(FP16, CPU)
    w = model_workload(str(DATA / "tiny_cnn.py"))
    cand = Candidate(w, Settings(amp="fp16"), CPU, "train")
    try:
        for _ in range(3):
            cand.step()
        assert _scaler_steps(cand) == 3  # three successful scaler.update() calls, no overflow
        assert cand.tuned.scaler.get_scale() == 2.0**16
    finally:
        cand.close()
    gate = Gate(w, CPU, "train", space)
    r = evaluate(w, Settings(amp="fp16"), CPU, "train", space, gate, policy=QUICK)
    assert r.status == "ok", r.reason
    assert r.precision == "fp16"
    assert 0 < r.grad_error <= r.grad_tolerance
    # and end to end, from a space that lists fp16 on a CPU
    advice = advisor.advise(model_file=str(DATA / "tiny_cnn.py"), mode="train", space=FP16)
    row = advice.trials.set_index("label").loc["amp=fp16"]
    assert row["status"] == "ok", row["reason"]


def test_fp16_overflow_is_skipped_and_the_scale_backed_off(tmp_path: Path) -> None:
    """Weights large enough that the first scaled backward overflows in fp16: as in training,
    the step is skipped and the scale halved until the gradients are finite."""
    path = tmp_path / "big.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    m = nn.Sequential(nn.Conv2d(4, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1),"
        " nn.Conv2d(64, 4, 3, padding=1))\n"
        "    with torch.no_grad():\n"
        "        for c in m: c.weight.mul_(60.0)\n"
        "    return m\n"
        "def example_inputs():\n    return (torch.randn(2, 4, 8, 8),)\n"
    )
    w = model_workload(str(path))
    cand = Candidate(w, Settings(amp="fp16"), CPU, "train")
    try:
        got = cand.capture()
        assert cand.tuned.scaler.get_scale() < 2.0**16  # backed off at least once
    finally:
        cand.close()
    assert all(torch.isfinite(g).all() for g in got.grads.values())


@pytest.fixture
def wrong_impls() -> Iterator[None]:
    from tests.plugins import faulty_impls

    faulty_impls.register_all()
    yield
    faulty_impls.unregister_all()


@pytest.mark.parametrize("seed", range(5))
def test_the_gate_verdict_does_not_depend_on_the_input_draw(seed: int, wrong_impls: None) -> None:
    """On a ReLU/BatchNorm network in training, exact fp32 channels_last passes on every draw,
    and a conv implementation that is wrong on purpose (a tap dropped, or the weights off by
    1e-3, which does not show in the network's outputs at all) is rejected on every draw."""
    w = model_workload(RELU_BN)
    space = load_space("cpu", CPU)
    gate = Gate(w, CPU, "train", space, seed=seed)

    def run(settings: Settings):  # noqa: ANN202
        return evaluate(w, settings, CPU, "train", space, gate, policy=QUICK)

    cl = run(Settings(memory_format="channels_last"))
    assert cl.status == "ok", cl.reason
    for impl in ("test_scaled", "test_tap"):
        bad = run(Settings(conv_impl=impl))
        assert bad.status == "rejected", (impl, bad.rel_error, bad.grad_error, bad.layer_error)
        assert "alone vs float64" in bad.reason
        assert bad.rejected_by.startswith("layer_tolerances.fp32=")


def test_a_candidate_a_layer_rejects_pays_no_training_check(wrong_impls: None) -> None:
    """A candidate rejected by its layers alone cannot be picked: its precision's training
    check (seconds) and the model-level noise floor are not paid for it."""
    w = model_workload(RELU_BN)
    space = load_space("cpu", CPU)
    gate = Gate(w, CPU, "train", space)
    bad = evaluate(w, Settings(conv_impl="test_tap", amp="bf16"), CPU, "train", space, gate,
                   policy=QUICK)  # fmt: skip
    assert bad.status == "rejected" and bad.rejected_by.startswith("layer_tolerances.bf16=")
    assert gate.checks == [] and bad.precision_check is None  # bf16 not judged for it
    assert gate._noise_taken == 0 and bad.tolerance is None
    ok = evaluate(w, Settings(amp="bf16"), CPU, "train", space, gate, policy=QUICK)
    assert ok.status == "ok" and [c.precision for c in gate.checks] == ["bf16"]


def test_a_rejected_candidate_names_the_setting_that_accepts_it(
    fast_space: str, tmp_path: Path
) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text(Path(fast_space).read_text().replace("name: fast_cpu", "name: strict"))
    with strict.open("a") as f:
        f.write("layer_tolerances: {bf16: 1.0e-6}\n")
    kw = dict(layer="Conv2d(3, 16, 3, padding=1)", input_shape="1,3,32,32", device="cpu")
    advice = advisor.advise(**kw, space=str(strict))
    bf16 = next(r for r in advice.results if r.settings.label() == "amp=bf16")
    assert bf16.status == "rejected" and bf16.rejected_by.startswith("layer_tolerances.bf16=")
    key, value = bf16.rejected_by.split("=")
    again = advisor.advise(**kw, space=str(strict), tolerances={key: float(value)})
    assert next(r for r in again.results if r.settings.label() == "amp=bf16").status == "ok"


def test_rejected_candidates_faster_than_the_pick_are_listed() -> None:
    from advisor.advice import rejected_faster
    from advisor.measure.results import TrialResult
    from advisor.measure.stats import Measurement

    def r(settings: Settings, ms: float, **kw: object) -> TrialResult:
        return TrialResult(settings=settings, measurement=Measurement(samples_ms=[ms] * 5), **kw)

    chosen = r(Settings(memory_format="channels_last"), 8.0, status="ok")
    fast_bad = r(Settings(amp="bf16"), 4.0, status="rejected", reason="gradient error 3.1e-01 "
                 "over the bf16 tolerance 1.0e-01", rejected_by="grad_tolerances.bf16=0.32")  # fmt: skip
    slow_bad = r(Settings(amp="bf16", memory_format="channels_last"), 9.0, status="rejected",
                 reason="error", rejected_by="tolerances.bf16=0.1")  # fmt: skip
    failed = r(Settings(conv_impl="unfold_gemm"), 1.0, status="failed", reason="crashed")
    (line,) = rejected_faster([chosen, fast_bad, slow_bad, failed], chosen)
    assert line.startswith("amp=bf16 (2.00x the recommendation's speed): gradient error 3.1e-01")
    assert line.endswith("--tolerance grad_tolerances.bf16=0.32 would accept it")


def test_unknown_tolerance_key_is_one_clear_error() -> None:
    with pytest.raises(advisor.AdvisorError, match="unknown tolerance 'grad.fp32'"):
        advisor.advise(
            layer="Conv2d(3, 4, 3)", input_shape="1,3,8,8", tolerances={"grad.fp32": 1e-3}
        )


class OpNames(TorchDispatchMode):
    """The ATen ops a step runs, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_a_layers_timed_training_step_has_no_loss_over_its_output(amp: str) -> None:
    """A layer's output feeds the next layer, not a loss: its timed step starts the backward from
    the output gradient (no cast, product and sum over the whole output, which were over half of
    a 1x1 conv's step on small_cnn), and the gradients are bit for bit the gate's, which takes
    them through a loss."""
    w = layer_workload(layer_spec("Conv2d(8, 16, 1)", input_shape="2,8,16,16"))
    cand = Candidate(w, Settings(memory_format="channels_last", amp=amp), CPU, "train", seed=3)
    try:
        cand.step()  # the first draws the output gradients
        with OpNames() as seen:
            cand.step()
        assert seen.ops["aten.convolution_backward"] == 1
        assert not {"aten.sum", "aten.mul", "aten.stack"} & set(seen.ops)
        timed = {n: p.grad.clone() for n, p in cand.tuned.module.named_parameters()}
        timed["input.0"] = cand.inputs[0].grad.clone()
        gated = cand.capture().grads
        assert timed.keys() == gated.keys()
        for name, g in gated.items():
            assert torch.equal(timed[name].to(g.dtype), g), name
    finally:
        cand.close()


def test_a_models_timed_training_step_keeps_its_loss() -> None:
    """A whole model's output goes into a loss in training: its timed step has one."""
    cand = Candidate(model_workload(RELU_BN), Settings(), CPU, "train", seed=3)
    try:
        cand.step()
        with OpNames() as seen:
            cand.step()
        assert seen.ops["aten.sum"] >= 1
    finally:
        cand.close()
