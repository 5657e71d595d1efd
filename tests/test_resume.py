"""Persistent, resumable studies: kill -9 in the middle of a study, run the same command again,
and every grid point ends up measured exactly once; a dead worker's trial is retried."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch

import advisor
from advisor.device.environment import current_environment
from advisor.search.ledger import RECORD_FORMAT
from advisor.search.storage import GRACE_S, RETRIES, open_storage
from advisor.search.study import study_name_for
from advisor.space import load_space
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from tests.conftest import DATA, run_env

GRID8 = str(DATA / "grid8_cpu.yaml")
LAYER = ("--layer", "Conv2d(8, 16, 3, padding=1)", "--input-shape", "2,8,48,48")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "advisor", *args]


def _study(url: str, prefix: str) -> optuna.Study | None:
    storage = open_storage(url)
    names = [n for n in optuna.get_all_study_names(storage) if n.startswith(prefix + "@")]
    return optuna.load_study(study_name=names[0], storage=storage) if names else None


def _params_key(t: optuna.trial.FrozenTrial) -> str:
    return json.dumps(t.params or t.system_attrs.get("fixed_params", {}), sort_keys=True)


def _results_per_point(study: optuna.Study) -> Counter[str]:
    return Counter(_params_key(t) for t in study.get_trials() if "result" in t.user_attrs)


@pytest.mark.slow  # a study killed mid-way and resumed: two CLI runs (13 s)
def test_kill_9_mid_study_then_resume_measures_each_point_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    out = tmp_path / "tuned.json"
    cmd = _cli("advise", *LAYER, "--device", "cpu", "--space", GRID8, "--storage", url,
               "--study-name", "killed", "--out", str(out), "--quiet")  # fmt: skip
    # The storage's schema and this process's SQLAlchemy imports first: under two busy loops the
    # first poll's opening took so long that all 8 trials finished before it (CI, 2026-11-27).
    storage = open_storage(url)
    proc = subprocess.Popen(cmd, env=run_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    before: dict[int, dict] = {}
    study: optuna.Study | None = None
    try:
        deadline = time.monotonic() + 180  # generous: a busy machine starts and measures slowly
        while time.monotonic() < deadline and proc.poll() is None:
            # The storage is opened once: a poll that opened it anew took so long on a busy
            # 2-core machine that all 8 trials finished between two polls.
            names = [] if study is not None else [
                n for n in optuna.get_all_study_names(storage) if n.startswith("killed@")
            ]  # fmt: skip
            if names:
                study = optuna.load_study(study_name=names[0], storage=storage)
            done = [t for t in study.get_trials() if "result" in t.user_attrs] if study else []
            if len(done) >= 2:
                before = {t.number: t.user_attrs["result"] for t in done}
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the advisor and its worker subprocess
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the study ended before it could be killed"
    assert 2 <= len(before) < 8 and not out.exists()

    start = time.monotonic()
    r = subprocess.run(cmd, env=run_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # No long wait for the dead trial: one would last until the space's budget (120 s) ran out.
    # The 6 trials left take seconds here alone, up to a minute on a busy machine.
    assert time.monotonic() - start < 2 * GRACE_S + 60

    study = _study(url, "killed")
    assert study is not None
    per_point = _results_per_point(study)
    assert len(per_point) == 8 and set(per_point.values()) == {1}  # none lost, none twice
    after = {t.number: t.user_attrs.get("result") for t in study.get_trials()}
    assert all(after[n] == res for n, res in before.items())  # finished ones were not re-run
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    trials = pd.read_csv(tmp_path / "tuned.trials.csv")
    assert len(trials) == 8 and json.loads(out.read_text())["result"]["trials"] == 8


@pytest.mark.slow  # waits out a heartbeat (10 s)
@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_dead_worker_elsewhere_is_retried_after_its_heartbeat_stops(tmp_path: Path) -> None:
    """A trial held by a worker on another machine that died: only its heartbeat tells."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    cpu = torch.device("cpu")
    space = load_space(GRID8, cpu)
    workload = layer_workload(layer_spec("Conv2d(3, 4, 3)", input_shape="1,3,16,16"))
    name = study_name_for(workload, "infer", space, current_environment(cpu), "remote")
    storage = open_storage(url)
    study = optuna.create_study(study_name=name, storage=storage)
    study.set_user_attr("record_format", RECORD_FORMAT)  # as the advisor makes it
    default = {"memory_format": "contiguous", "amp": "off", "conv_impl": "native"}
    study.enqueue_trial(default)
    trial = study.ask()  # the remote worker takes the default point...
    storage.set_trial_user_attr(trial._trial_id, "worker", "elsewhere:4242:1")
    storage.record_heartbeat(trial._trial_id)  # ...beats once, then dies
    start = time.monotonic()
    advice = advisor.advise(layer="Conv2d(3, 4, 3)", input_shape="1,3,16,16", device="cpu",
                            space=GRID8, storage=url, study_name="remote")  # fmt: skip
    waited = time.monotonic() - start
    assert GRACE_S <= waited < GRACE_S + 60  # not until the budget (120 s) ran out
    assert len(advice.trials) == 8 and advice.baseline.status == "ok"
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    assert set(_results_per_point(study).values()) == {1}
    dead = study.trials[trial.number]
    assert dead.state == optuna.trial.TrialState.FAIL and "result" not in dead.user_attrs


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_trial_taken_by_a_process_killed_before_naming_itself_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 between popping a waiting trial and recording the process's name (the moment
    the kill test above stops a run, right after a result) left a RUNNING trial nobody owned and,
    on SQLite, nothing beating: the resumed run waited for it until its budget ran out."""
    monkeypatch.setattr("advisor.search.study.GRACE_S", 1)  # owner-less: orphaned after 2 s
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    cpu = torch.device("cpu")
    space = load_space(GRID8, cpu)
    workload = layer_workload(layer_spec("Conv2d(3, 4, 3)", input_shape="1,3,16,16"))
    name = study_name_for(workload, "infer", space, current_environment(cpu), "unnamed")
    study = optuna.create_study(study_name=name, storage=open_storage(url))
    study.set_user_attr("record_format", RECORD_FORMAT)  # as the advisor makes it
    study.enqueue_trial({"memory_format": "channels_last", "amp": "off", "conv_impl": "native"})
    taken = study.ask()  # popped: RUNNING, and its process "dies" before naming itself
    start = time.monotonic()
    advice = advisor.advise(layer="Conv2d(3, 4, 3)", input_shape="1,3,16,16", device="cpu",
                            space=GRID8, storage=url, study_name="unnamed")  # fmt: skip
    assert time.monotonic() - start < 90  # not until the budget (120 s) ran out
    assert len(advice.trials) == 8
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    assert set(_results_per_point(study).values()) == {1} and len(_results_per_point(study)) == 8
    dead = study.trials[taken.number]
    assert dead.state == optuna.trial.TrialState.FAIL and "result" not in dead.user_attrs


# journal: the same resume through the other storage (1.6 s), in the slow run
@pytest.mark.parametrize("kind", [pytest.param("journal", marks=pytest.mark.slow), "sqlite"])
def test_resumed_study_measures_nothing_again(tmp_path: Path, kind: str) -> None:
    url = str(tmp_path / "s.log") if kind == "journal" else f"sqlite:///{tmp_path / 's.db'}"
    kw = dict(layer="Conv2d(3, 4, 3)", input_shape="1,3,16,16", device="cpu",
              space=str(DATA / "fast_cpu.yaml"), storage=url, study_name="again")  # fmt: skip
    advisor.advise(**kw)
    study = _study(url, "again")
    assert study is not None
    stored = [t.user_attrs["result"] for t in study.trials]
    advisor.advise(**kw)  # only the final interleaved re-time measures anything
    study = _study(url, "again")
    assert study is not None and len(study.trials) == 4
    assert [t.user_attrs["result"] for t in study.trials] == stored


@pytest.mark.slow  # three CLI runs that crash (12 s)
def test_in_process_crash_is_retried_then_recorded_as_failed(tmp_path: Path) -> None:
    """--in-process: a segfaulting candidate takes the advisor down. Each rerun retries it (its
    trial was left RUNNING by a dead process: a journal file has no heartbeats, the dead pid
    tells); after RETRIES + 1 deaths it is recorded as failed and the study finishes."""
    journal = tmp_path / "s.log"
    out = tmp_path / "tuned.json"
    cmd = _cli("advise", "--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,16,16", "--device",
               "cpu", "--space", str(DATA / "crash_cpu.yaml"), "--storage", str(journal),
               "--study-name", "crashy", "--in-process", "--out", str(out), "--quiet")  # fmt: skip
    env = {**run_env(), "ADVISOR_PLUGINS": "tests.plugins.faulty_impls"}
    codes = [subprocess.run(cmd, env=env, capture_output=True, timeout=120).returncode
             for _ in range(RETRIES + 2)]  # fmt: skip
    assert codes == [-signal.SIGSEGV] * (RETRIES + 1) + [0]
    trials = pd.read_csv(tmp_path / "tuned.trials.csv").set_index("conv_impl")
    assert trials.loc["native", "status"] == "ok"
    assert trials.loc["test_crash", "status"] == "failed"
    assert f"died {RETRIES + 1} times" in trials.loc["test_crash", "reason"]
    study = _study(str(journal), "crashy")
    assert study is not None and set(_results_per_point(study).values()) == {1}
