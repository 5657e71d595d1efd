"""The search end to end through the Python API (in process, fast space)."""

import io
import math

import pandas as pd
import pytest
import torch

import advisor
from advisor.advice import csv_text
from advisor.execute.runner import Candidate, Gate, evaluate
from advisor.gate.numeric import Errors
from advisor.gate.training import REFERENCE
from advisor.knobs import Settings
from advisor.measure.verdict import PrecisionCheck
from advisor.space import SearchSpace, load_space
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from tests._cli import python_code
from tests.conftest import FAST_SPACE

CPU = torch.device("cpu")


def test_advise_layer_api(fast_space: str, tmp_path) -> None:
    advice = advisor.advise(
        layer="Conv2d(3, 8, 3, padding=1)",
        input_shape="2,3,32,32",
        device="cpu",
        space=fast_space,
    )
    df = advice.trials
    assert isinstance(df, pd.DataFrame)
    assert len(df) == 4
    assert df.iloc[0]["label"] == "default"  # the baseline is enqueued first
    assert (df["status"] == "ok").all()
    assert (df["samples"] >= 5).all()
    assert advice.config.result is not None
    assert advice.config.result.baseline.median_ms > 0
    assert advice.baseline.settings == Settings()
    path = advice.save(tmp_path / "tuned.json")
    assert advisor.load_config(path) == advice.config
    csv = pd.read_csv(tmp_path / "tuned.trials.csv")
    assert len(csv) == 4 and "rel_error" in csv.columns
    # the file reads back as the table pandas would have written (`csv_text`)
    pd.testing.assert_frame_equal(csv, pd.read_csv(io.StringIO(df.to_csv(index=False))))


ROWS = [
    {"trial": 0, "label": "default", "reason": "", "ms": 1.5, "ok": True, "note": None},
    {"trial": None, "label": 'a "quoted", comma', "reason": "x\ny", "ms": math.nan, "ok": False,
     "layers": [1, 2], "inf": math.inf},
    {"label": "missing keys", "ms": 1e-20, "ok": None},
    {"trial": 2, "label": "ünïcode", "ms": 0.1 + 0.2, "note": "0042"},
]


def test_the_trials_csv_reads_back_as_pandas_writes_it() -> None:
    ours, theirs = csv_text(ROWS), pd.DataFrame(ROWS).to_csv(index=False)
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(ours)), pd.read_csv(io.StringIO(theirs)))
    assert '"a ""quoted"", comma"' in ours and '"x\ny"' in ours and ours.startswith("trial,label")
    # the same text, where no integer column has a gap (pandas writes such a column as floats)
    assert csv_text(ROWS[:1]) == pd.DataFrame(ROWS[:1]).to_csv(index=False)
    assert csv_text([]) == pd.DataFrame([]).to_csv(index=False)


def test_saving_advice_imports_no_pandas(tmp_path) -> None:
    code = (
        "import sys, advisor\n"
        "a = advisor.advise(layer='Conv2d(3, 8, 3)', input_shape='1,3,16,16', device='cpu',\n"
        "                   space=sys.argv[1])\n"
        "a.save(sys.argv[2])\n"
        "print('pandas' in sys.modules)\n"
    )
    r = python_code(code, FAST_SPACE, str(tmp_path / "tuned.json"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False" and (tmp_path / "tuned.trials.csv").is_file()


def test_advise_model_train_api(fast_space: str, small_model_file: str) -> None:
    advice = advisor.advise(
        model_file=small_model_file, mode="train", device="cpu", space=fast_space
    )
    df = advice.trials
    assert len(df) == 4
    assert df["grad_error"].notna().all()
    assert advice.config.mode == "train"


def test_advise_live_model_api(fast_space: str) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    advice = advisor.advise(model, (torch.randn(1, 3, 16, 16),), device="cpu", space=fast_space)
    assert advice.config.workload["kind"] == "model"


def test_gate_rejects_inaccurate_candidate(tmp_path) -> None:
    # bf16 is truly inaccurate at the 1e-3 level: with a 1e-6 bf16 layer tolerance it must be
    # rejected, with its error recorded, and never recommended.
    space = tmp_path / "strict.yaml"
    space.write_text(
        "name: strict\nknobs:\n  amp: ['off', bf16]\n"
        "layer_tolerances: {bf16: 1.0e-6}\n"
        "timing: {min_samples: 3, max_time_s: 0.1, warmup_s: 0}\nper_layer: false\nrace: false\n"
    )
    advice = advisor.advise(
        layer="Conv2d(8, 8, 3)", input_shape="1,8,24,24", device="cpu", space=str(space)
    )
    df = advice.trials.set_index("label")
    assert df.loc["amp=bf16", "status"] == "rejected"
    assert df.loc["amp=bf16", "layer_error"] > 1e-4
    assert "tolerance" in df.loc["amp=bf16", "reason"]
    assert advice.settings.amp == "off"


def test_evaluate_reports_failures_as_results() -> None:
    w = layer_workload(layer_spec("Conv2d(3, 8, 3)", input_shape="1,3,16,16"))
    space = SearchSpace(name="t", knobs={})
    gate = Gate(w, CPU, "infer", space)
    bad = evaluate(w, Settings(conv_impl="no_such_impl"), CPU, "infer", space, gate)
    assert bad.status == "failed"
    assert "no_such_impl" in (bad.reason or "")


def test_reference_noise_floor_is_small_for_a_layer() -> None:
    w = layer_workload(layer_spec("Conv2d(3, 8, 3)", input_shape="2,3,16,16"))
    space = SearchSpace(name="t", knobs={})
    gate = Gate(w, CPU, "train", space)
    (ref,) = gate.cases
    noise = gate.noise()
    # a conv is linear: inputs moved by 1e-5 move its answers by about as much, no more
    eps = space.gate.perturbation
    assert eps / 10 < noise.out < 3 * eps and noise.grad < 3 * eps
    # a layer's input is an activation in a network: its gradient is computed and compared
    assert set(ref.grads) == {"weight", "bias", "input.0"}


def test_the_noise_floor_takes_its_answers_only_until_the_candidate_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = layer_workload(layer_spec("Conv2d(3, 8, 3)", input_shape="2,3,16,16"))
    tight = {"fp32": 1e-9}  # below any rounding: every verdict reads the noise floor
    space = SearchSpace(name="t", knobs={}, tolerances=tight, grad_tolerances=tight)
    gate = Gate(w, CPU, "train", space)
    dtypes: list[torch.dtype | None] = []
    capture = gate._capture

    def counted(settings: Settings, case: int, dtype: torch.dtype | None = None, **kw):  # noqa: ANN202
        dtypes.append(dtype)
        return capture(settings, case, dtype, **kw)

    monkeypatch.setattr(gate, "_capture", counted)
    cl = Settings(memory_format="channels_last")
    # within the first moved answer's spread (about 1e-5 for a conv): accepted on it alone
    assert gate.tolerance(cl, Errors(1e-6, 1e-6)).judge(Errors(1e-6, 1e-6)) is None
    assert dtypes == [torch.float32]
    first = gate.noise(lambda _: True)
    # beyond every answer's: the other moved ones and float64's are taken, each once, and the
    # floor can only grow
    assert gate.tolerance(cl, Errors(1.0, 1.0)).judge(Errors(1.0, 1.0)) is not None
    assert dtypes == [torch.float32] * space.gate.perturbations + [torch.float64]
    whole = gate.noise()
    assert whole.out >= first.out and whole.grad >= first.grad  # type: ignore[operator]
    assert len(dtypes) == space.gate.perturbations + 1  # nothing measured again


@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "rejected"])
def test_a_reduced_precisions_yardstick_is_measured_only_for_an_error_over_the_space_s(
    monkeypatch: pytest.MonkeyPatch, accepted: bool
) -> None:
    """PyTorch's own bf16 path's error (the yardstick) and the noise floor only raise the
    space's tolerance: an error within it is judged without them, and a precision its training
    check rejected without the floor."""
    w = layer_workload(layer_spec("Conv2d(3, 8, 3)", input_shape="2,3,16,16"))
    gate = Gate(w, CPU, "train", SearchSpace(name="t", knobs={}))
    bf16 = Settings(amp="bf16")
    gate.know([PrecisionCheck(precision="bf16", own_path=bf16, mode="train", accepted=accepted,
                              gap=0.0, band=0.0, summary="bf16: as the test says")])  # fmt: skip
    captured: list[Settings] = []
    capture = gate._capture

    def counted(settings: Settings, case: int, dtype: torch.dtype | None = None, **kw):  # noqa: ANN202
        captured.append(settings)
        return capture(settings, case, dtype, **kw)

    monkeypatch.setattr(gate, "_capture", counted)
    cl_bf16 = bf16.model_copy(update={"memory_format": "channels_last"})
    small, large = Errors(1e-3, 1e-3), Errors(0.5, 0.9)  # within bf16's 2e-2 and 1e-1; over
    tol = gate.tolerance(cl_bf16, small)
    assert (tol.judge(small) is None) == accepted and tol.basis == "the space's bf16 tolerance"
    assert captured == []
    assert gate.tolerance(cl_bf16, large).judge(large) is not None
    if not accepted:  # the yardstick comes before the training check; no floor for a rejection
        assert captured == [bf16]
        return
    answers = gate.space.gate.perturbations + 1  # the floor's: all of them, for a rejection
    assert captured == [bf16] + [REFERENCE] * answers  # the yardstick first
    gate.tolerance(cl_bf16, large)
    assert len(captured) == 1 + answers  # each measured once


def test_candidate_step_restores_flags() -> None:
    w = layer_workload(layer_spec("Conv2d(3, 8, 3)", input_shape="1,3,16,16"))
    before = torch.backends.cudnn.benchmark
    c = Candidate(w, Settings(cudnn_benchmark=not before), CPU, "train")
    c.step()
    c.close()
    assert torch.backends.cudnn.benchmark == before


def test_unknown_device_and_mode(fast_space: str) -> None:
    with pytest.raises(advisor.AdvisorError, match="unknown device"):
        advisor.advise(layer="Conv2d(3, 8, 3)", input_shape="1,3,8,8", device="tpu")
    with pytest.raises(advisor.AdvisorError, match="mode"):
        advisor.advise(layer="Conv2d(3, 8, 3)", input_shape="1,3,8,8", mode="fly")
    with pytest.raises(advisor.AdvisorError, match="CUDA is not available"):
        if torch.cuda.is_available():
            raise advisor.AdvisorError("CUDA is not available (skipped: CUDA present)")
        load_space(None, advisor.device.environment.resolve_device("cuda"))
