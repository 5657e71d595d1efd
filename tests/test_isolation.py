"""Isolated trials: a crashing, a hanging and an out-of-memory candidate fail with their reasons,
the worker is replaced, the study goes on, and no flag leaks from one trial into the next.

The faulty candidates are test-only implementations (tests/plugins/faulty_impls.py), loaded in the
advisor and its workers through $ADVISOR_PLUGINS.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch

from advisor.device.global_state import global_state
from advisor.execute.evaluators import InProcessEvaluator
from advisor.execute.gating import failed
from advisor.execute.isolate import IsolatedEvaluator, RetimeFailed
from advisor.knobs import Settings
from advisor.report.progress import status_text
from advisor.space import SearchSpace
from advisor.stages.layer_groups import layer_groups
from advisor.workload.build import layer_workload, model_workload
from advisor.workload.info import LayerInfo
from advisor.workload.layer_spec import layer_spec
from tests._cli import advisor_cli
from tests.conftest import DATA, run_env

PLUGINS = "tests.plugins.faulty_impls"
# A 1x1 conv on a 4x4 input runs on one thread: a trial takes well under its short limits on a
# busy machine too (a multi-threaded conv there waits for its second thread at every call).
LAYER, SHAPE = "Conv2d(3, 8, 1)", "1,3,4,4"
CPU = torch.device("cpu")
SPACE = SearchSpace(
    name="t", knobs={}, timing={"min_samples": 3, "max_time_s": 0.1, "warmup_s": 0.0}
)
FRESH_FLAGS = (
    "import json, torch; from advisor.knobs import GlobalFlags; print(json.dumps({"
    "**GlobalFlags.read(), 'threads': torch.get_num_threads(), "
    "'deterministic': torch.are_deterministic_algorithms_enabled()}))"
)


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The faulty implementations here and in spawned workers; removed again afterwards."""
    monkeypatch.setenv("ADVISOR_PLUGINS", PLUGINS)
    from tests.plugins import faulty_impls

    faulty_impls.register_all()
    yield
    faulty_impls.unregister_all()


@pytest.mark.slow  # the CLI past a crash, a hang and an OOM (17 s); a replaced worker: below
def test_study_with_crash_hang_and_oom_finishes_with_a_healthy_pick(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    r = advisor_cli("advise", "--layer", LAYER, "--input-shape", SHAPE, "--device", "cpu",
                    "--space", str(DATA / "faulty_cpu.yaml"), "--trial-timeout", "4",
                    "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out), "--quiet",
                    env={"ADVISOR_PLUGINS": PLUGINS}, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    trials = pd.read_csv(tmp_path / "tuned.trials.csv").set_index("conv_impl")
    assert trials.loc["test_crash", "status"] == "failed"
    assert trials.loc["test_crash", "reason"] == "worker crashed (SIGSEGV)"
    assert trials.loc["test_hang", "status"] == "failed"
    assert trials.loc["test_hang", "reason"] == "timed out after 4 s (killed)"
    assert trials.loc["test_oom", "status"] == "failed"
    assert trials.loc["test_oom", "reason"].startswith("out of memory (")
    # each failure's kind, for the report's few words (never read off the reason)
    assert list(trials.loc[["test_crash", "test_hang", "test_oom"], "kind"]) == ["crash", "timeout",
                                                                                  "oom"]  # fmt: skip
    # The candidates after the crash and after the hang ran on replacement workers.
    assert trials.loc["native", "status"] == trials.loc["unfold_gemm", "status"] == "ok"
    cfg = json.loads(out.read_text())
    assert cfg["settings"]["conv_impl"] in ("native", "unfold_gemm")
    assert cfg["result"]["failed"] == 3


def test_worker_is_replaced_and_flags_never_leak(plugins: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    log = tmp_path / "probe.jsonl"
    monkeypatch.setenv("ADVISOR_TEST_PROBE_LOG", str(log))
    fresh = subprocess.Popen(
        [sys.executable, "-c", FRESH_FLAGS], stdout=subprocess.PIPE, text=True, env=run_env()
    )
    w = layer_workload(layer_spec(LAYER, input_shape=SHAPE))
    # A limit shorter than a worker's start-up (importing torch, the fp32 reference): it covers
    # the candidate's own evaluation only.
    ev = IsolatedEvaluator(w.info, CPU, "infer", SPACE, timeout_s=3.0)
    try:
        tweaked = Settings(conv_impl="test_leaky", tf32="on", cudnn_benchmark=True)
        first = ev(tweaked)
        assert first.status == "ok", first.reason
        first_pid = ev.pid
        # a forward that sets one thread, deterministic algorithms and autocast, and leaves them
        assert ev(Settings(conv_impl="test_threads")).status in ("ok", "rejected")
        assert ev(tweaked.model_copy(update={"conv_impl": "test_probe"})).status == "ok"
        assert ev(Settings(conv_impl="test_probe")).status == "ok"
        crashed = ev(Settings(conv_impl="test_crash"))
        assert (crashed.status, crashed.reason) == ("failed", "worker crashed (SIGSEGV)")
        assert crashed.kind == "crash"
        assert ev(Settings(conv_impl="test_probe")).status == "ok"
        assert ev.pid != first_pid and ev.starts == 2
    finally:
        ev.close()
    pristine = json.loads(fresh.communicate(timeout=60)[0])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    setups = [{k: v for k, v in x.items() if k not in ("pid", "when")}
              for x in lines if x["when"] == "setup"]  # fmt: skip
    forwards = [x for x in lines if x["when"] == "forward"]
    # Each trial starts from PyTorch's defaults, although the one before changed the flags
    # (through the advisor, and behind its back in test_leaky's set-up).
    assert setups == [pristine, pristine, pristine]
    # ...and the candidate ran with its own flags.
    assert forwards[0]["cudnn_benchmark"] is True and forwards[0]["tf32"]["matmul"] != "none"
    assert forwards[-1]["cudnn_benchmark"] is False


def test_in_process_evaluator_restores_global_state(plugins: None) -> None:
    w = layer_workload(layer_spec(LAYER, input_shape=SHAPE))
    before = global_state()
    ev = InProcessEvaluator(w, CPU, "infer", SPACE)
    r = ev(Settings(conv_impl="test_leaky", tf32="on", cudnn_benchmark=True))
    assert r.status == "ok"
    assert global_state() == before
    threads = ev(Settings(conv_impl="test_threads"))
    assert threads.status in ("ok", "rejected") and global_state() == before
    oom = ev(Settings(conv_impl="test_oom"))
    assert oom.status == "failed" and oom.reason.startswith("out of memory (")
    assert global_state() == before


@pytest.mark.parametrize(
    "reason,expected",
    [
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
         "can't allocate memory: you tried to allocate 1152921504606846976 bytes. Error code 12",
         "out of memory (can't allocate memory: you tried to allocate 1152921504606846976 bytes)"),
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
         "out of memory (out of memory. Tried to allocate 20.00 GiB)"),
        ("out of memory", "out of memory"),
        ("RuntimeError: shapes do not match", "RuntimeError: shapes do not match"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered",
         "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ],
)  # fmt: skip
def test_a_failure_is_named_by_its_kind_where_the_harness_acts_on_it(
    reason: str, expected: str
) -> None:
    r = failed(Settings(), reason)
    assert r.status == "failed" and r.reason == expected
    kind = "oom" if expected.startswith("out of memory") else None
    assert r.failure == ("device" if "CUDA error" in reason else kind)


def test_a_worker_that_cannot_start_fails_the_candidate_with_its_kind(tmp_path: Path) -> None:
    """The model file imports here, then breaks: the worker cannot load it, and the candidate's
    failure says so, its kind `start` (the report's "worker did not start")."""
    target = tmp_path / "net.py"
    target.write_text((DATA / "tiny_cnn.py").read_text())
    w = model_workload(target)
    target.write_text("raise RuntimeError('edited since')\n")
    ev = IsolatedEvaluator(w.info, CPU, "infer", SPACE, timeout_s=60.0)
    try:
        r = ev(Settings())
    finally:
        ev.close()
    assert (r.status, r.kind) == ("failed", "start")
    assert r.reason.startswith("worker failed to start: ") and "edited since" in r.reason
    assert status_text(r.status, r.kind) == "failed: worker did not start"


@pytest.mark.slow  # a crash and a 6 s hang in a re-time, each a new worker (16 s)
def test_isolated_retime_of_finalists_and_its_failures(plugins: None) -> None:
    w = layer_workload(layer_spec(LAYER, input_shape=SHAPE))
    before = global_state()
    ev = IsolatedEvaluator(w.info, CPU, "infer", SPACE, timeout_s=3.0)
    try:
        measured = [ev(Settings()), ev(Settings(memory_format="channels_last"))]
        worker = ev.pid
        fresh = ev.retime(measured)
        assert ev.pid == worker  # the same worker re-times them, interleaved
        assert [r.settings for r in fresh] == [r.settings for r in measured]
        for old, new in zip(measured, fresh, strict=True):
            assert new.status == "ok" and new.measurement is not None
            assert new.measurement.samples_ms != old.measurement.samples_ms  # measured again
            assert new.rel_error == old.rel_error  # the check is not repeated: only the timing
        # A finalist that crashes the worker: the re-time fails with the reason; no one waits.
        crash = measured[0].model_copy(update={"settings": Settings(conv_impl="test_crash")})
        with pytest.raises(RetimeFailed, match="worker crashed"):
            ev.retime([measured[0], crash])
        hang = measured[0].model_copy(update={"settings": Settings(conv_impl="test_hang")})
        with pytest.raises(RetimeFailed, match="timed out after 6 s"):
            ev.retime([measured[0], hang])
        assert ev(Settings()).status == "ok"  # and the next trial gets a fresh worker
    finally:
        ev.close()
    assert global_state() == before  # the parent's flags were never touched


def test_advise_survives_a_failed_retime(plugins: None, caplog: pytest.LogCaptureFixture) -> None:
    """A finalist that ran cleanly as a trial but crashes when re-timed: a warning, and PyTorch's
    default stays (a recommendation is never one that was not re-timed against the default)."""
    from advisor.advice import build_advice
    from advisor.device.environment import current_environment
    from advisor.measure.stats import Measurement
    from advisor.search.options import SearchOptions, SearchOutcome
    from advisor.stages.finalists import retime_finalists

    w = layer_workload(layer_spec(LAYER, input_shape=SHAPE))
    ev = InProcessEvaluator(w, CPU, "infer", SPACE)
    good = ev(Settings())
    assert good.measurement is not None
    # Three times as many samples, each a quarter of the default's: beyond noise by the
    # Mann-Whitney test even where the default stopped at the policy's 3 samples
    fast = Measurement(samples_ms=[s / 4 for s in good.measurement.samples_ms] * 3)
    crash = good.model_copy(update={"settings": Settings(conv_impl="test_crash"),
                                    "measurement": fast})  # fmt: skip
    outcome = SearchOutcome(
        results=[good, crash], baseline=good, dropped=[], study_name="s",
        environment=current_environment("cpu"), elapsed_s=0.0,
    )  # fmt: skip
    space = SPACE.model_copy(update={"retime_top": 2})
    with caplog.at_level(logging.WARNING, logger="advisor"):
        n, why = retime_finalists(w, outcome, CPU, space, SearchOptions(mode="infer", isolate=True))
    assert n == 0 and why == "worker crashed (SIGSEGV)" and outcome.results == [good, crash]
    assert "interleaved re-time failed: worker crashed (SIGSEGV)" in caplog.text
    advice = build_advice(outcome, w.info, "infer", "s", retime_error=why)
    assert advice.settings == Settings() and "re-time failed" in advice.config.result.why
    # without the failure, the (faster) candidate would have been picked from the trials
    assert build_advice(outcome, w.info, "infer", "s").settings == crash.settings


UNSEEDED_NET = (
    "import torch\nfrom torch import nn\n"
    "def build_model():\n"  # no manual_seed: the advisor's fixed seed decides the weights
    "    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3))\n"
    "def example_inputs():\n    return (torch.randn(2, 3, 16, 16),)\n"
)


# each a worker (3.4 s): the unseeded file in the slow run
@pytest.mark.parametrize(
    "seeded",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["seeded file", "unseeded file"],
)
def test_isolated_per_layer_evaluation_uses_the_models_weights(
    plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    """A model file's layer timed in a worker computes with its weights in the model, not with a
    fresh initialisation of its spec: the worker rebuilds the model and takes that layer."""
    target = DATA / "tiny_cnn.py"
    if not seeded:
        target = tmp_path / "net.py"
        target.write_text(UNSEEDED_NET)
    log = tmp_path / "probe.jsonl"
    monkeypatch.setenv("ADVISOR_TEST_PROBE_LOG", str(log))
    model = model_workload(target)
    group = layer_groups(model, Settings(), CPU)[-1]
    info = group.workload.info
    assert isinstance(info, LayerInfo) and info.source is not None
    weight = model.make_model().get_submodule(group.names[0]).weight.detach().double()
    ev = IsolatedEvaluator(info, CPU, "infer", SPACE, timeout_s=60.0)
    try:
        result = ev(Settings(conv_impl="test_probe"))
    finally:
        ev.close()
    assert result.status == "ok", result.reason
    forwards = [json.loads(line) for line in log.read_text().splitlines()]
    sums = [x["weight_sum"] for x in forwards if x["when"] == "forward"]
    assert sums and sums == pytest.approx([float(weight.sum())] * len(sums), rel=1e-12)
    fresh = layer_workload(info.spec).make_model().weight.detach().double()
    assert float(fresh.sum()) != pytest.approx(float(weight.sum()), rel=1e-6)
