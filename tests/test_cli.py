"""The `advisor` command as a user runs it: real subprocesses, real files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._cli import advisor_cli, advisor_cli_many, python_code


def test_advise_layer_cli_writes_config_and_trials(tmp_path: Path, fast_space: str) -> None:
    out = tmp_path / "tuned.json"
    r = advisor_cli(
        "advise",
        "--layer",
        "Conv2d(3, 8, 3, padding=1)",
        "--input-shape",
        "1,3,32,32",
        "--device",
        "cpu",
        "--mode",
        "infer",
        "--space",
        fast_space,
        "--out",
        str(out),
        "--json",
        "--in-process",
        new_interpreter=True,  # the run's time counts the interpreter's start
    )
    assert r.returncode == 0, r.stderr
    cfg = json.loads(out.read_text())
    assert cfg["settings"]["conv_impl"] == "native"
    assert cfg["environment"]["device_type"] == "cpu"
    assert cfg["result"]["baseline"]["median_ms"] > 0
    assert json.loads(r.stdout) == cfg  # --json prints the same config on stdout
    assert (tmp_path / "tuned.trials.csv").is_file()
    assert "PyTorch default" in r.stderr and "Why:" in r.stderr
    # stderr is a pipe here, where a progress bar draws nothing: each stage still says when it
    # ends, and the summary says where the time went and whether tuning paid for itself.
    assert "start-up and load: done in" in r.stderr and "global knobs: done in" in r.stderr
    assert "Time: start-up and load" in r.stderr and "Worth it: tuning took" in r.stderr
    stage_s = cfg["result"]["stage_s"]
    assert [k for k in stage_s if ": " not in k][:2] == ["start-up and load", "global knobs"]
    assert stage_s["total"] == pytest.approx(cfg["result"]["tuning_s"], abs=0.01)
    if sys.platform.startswith("linux"):  # the command's own start-up (Python, torch's import)
        assert stage_s["start-up and load: process starts"] > 0.3, stage_s
    header = (tmp_path / "tuned.trials.csv").read_text().splitlines()[0].split(",")
    assert {"stage", "wall_s"} <= set(header)


@pytest.mark.slow  # two isolated CLI runs (15 s); test_clean_exit runs one
def test_advise_model_file_isolated_and_resumed(
    tmp_path: Path, fast_space: str, small_model_file: str
) -> None:
    out = tmp_path / "t.json"
    args = (
        "advise",
        small_model_file,
        "--mode",
        "train",
        "--device",
        "cpu",
        "--space",
        fast_space,
        "--out",
        str(out),
        "--quiet",
        "--study-name",
        "cli-test",
    )
    r = advisor_cli(*args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --quiet
    first = json.loads(out.read_text())
    # The same command again resumes the stored study: no trial is run again (only the final
    # interleaved re-time of the finalists is measured afresh).
    r = advisor_cli(*args)
    assert r.returncode == 0, r.stderr
    again = json.loads(out.read_text())
    assert again["result"]["trials"] == first["result"]["trials"] == 4
    assert again["settings"].keys() == first["settings"].keys()
    import optuna

    from advisor.search.storage import open_storage

    study = optuna.load_study(
        study_name=f"cli-test@{first['environment']['fingerprint']}", storage=open_storage(None)
    )
    evaluated = [t for t in study.trials if "result" in t.user_attrs]
    assert len(evaluated) == 4  # each grid point measured exactly once over both runs


BAD_INPUTS = [
    (["advise", "--layer", "Conv2d(3, 16, 3", "--input-shape", "1,3,8,8"], "cannot parse"),
    (["advise", "--layer", "Conv2d(3, 16, 3)"], "missing input shape"),
    (["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "1,4,8,8"], "channels"),
    (["advise", "no/such/model.py"], "model file not found"),
    (["advise", "tests/"], "model file tests is a folder"),  # not "not found": it is there
    (["advise", "--layer-file", "tests", "--input-shape", "1,3,8,8"], "layer spec file tests is a folder"),  # fmt: skip
    (["advise", "tests/data/tiny_cnn.py", "--build", "raising_model"], "weights not found"),
    (["advise", "tests/data/tiny_cnn.py", "--inputs", "bad_inputs"], "fails on"),
    (
        [
            "advise",
            "--layer",
            "Conv2d(3, 16, 3)",
            "--input-shape",
            "1,3,8,8",
            "--device",
            "tpu",
        ],
        "unknown device",
    ),
    (
        [
            "advise",
            "--layer",
            "Conv2d(3, 16, 3)",
            "--input-shape",
            "1,3,8,8",
            "--space",
            "nope",
        ],
        "unknown search space",
    ),
    (["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "1,3,8,8", "--space", "tests"],
     "search-space file tests is a folder"),  # fmt: skip
    (
        ["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "1,3,8,8", "--steps", "0"],
        "--steps must be a positive",
    ),  # fmt: skip
    (
        ["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "1,3,8,8", "--trial-timeout", "0"],
        "--trial-timeout must be a positive number, got 0",
    ),  # fmt: skip
    (
        ["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "1,3,8,8", "--max-memory", "-1"],
        "--max-memory must be a positive number, got -1",
    ),  # fmt: skip
    (  # an empty part is a typo, never a separator: not read as 2,16,16
        ["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "2,x,16,16"],
        "not a comma-separated list of integers: '2,x,16,16'",
    ),
    (
        ["advise", "--layer", "Conv2d(3, 16, 3)", "--input-shape", "2,3,8,8", "--batch-sizes", "2,,4"],
        "--batch-sizes takes comma-separated integers, got '2,,4'",
    ),  # fmt: skip
    (["advise"], "nothing to tune"),
    (["show", "no_such.json"], "not found"),
    (["show", "tests"], "config file tests is a folder"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """Every bad-input case through the CLI's main, in one fresh process."""
    out = tmp_path_factory.mktemp("bad") / "never.json"
    cases = {}
    for i, (args, _) in enumerate(BAD_INPUTS):
        if args[0] == "advise":
            args = [*args, "--out", str(out), "--storage", "memory"]
        cases[str(i)] = args
    runs = advisor_cli_many(cases, cwd=Path(__file__).parent.parent)
    return out, [runs[str(i)] for i in range(len(BAD_INPUTS))]


@pytest.mark.parametrize("case", range(len(BAD_INPUTS)))
def test_bad_input_is_one_line_exit_2_and_no_file(
    bad_input_runs: tuple[Path, list[Any]], case: int
) -> None:
    out, runs = bad_input_runs
    r, needle = runs[case], BAD_INPUTS[case][1]
    assert r.returncode == 2
    lines = r.stderr.splitlines()  # no blank line before or after it
    assert len(lines) == 1 and r.stderr.endswith("\n"), r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()


def test_corrupt_config_for_show(tmp_path: Path) -> None:
    bad = tmp_path / "tuned.json"
    bad.write_text("{not json")
    r = advisor_cli("show", str(bad))
    assert r.returncode == 2 and "not valid JSON" in r.stderr


def test_schema_env_and_show(tmp_path: Path, fast_space: str) -> None:
    out = tmp_path / "t.json"
    advise = ["advise", "--layer", "Conv1d(4, 4, 3)", "--input-shape", "2,4,64", "--device", "cpu",
              "--space", fast_space, "--out", str(out), "--quiet", "--in-process", "--storage",
              "memory"]  # fmt: skip
    runs = advisor_cli_many(
        {
            "schema": ["schema"],
            "env": ["env", "--device", "cpu"],
            "env-json": ["env", "--device", "cpu", "--json"],
            "advise": advise,
            "show": ["show", str(out)],
        }
    )
    r = runs["schema"]
    assert r.returncode == 0
    assert "settings" in json.loads(r.stdout)["properties"]
    r = runs["env"]
    assert r.returncode == 0 and "fingerprint" in r.stdout and "CUDA only" in r.stdout
    env = json.loads(runs["env-json"].stdout)
    assert env["environment"]["device_type"] == "cpu"
    assert runs["advise"].returncode == 0, runs["advise"].stderr
    r = runs["show"]
    assert r.returncode == 0
    assert "This machine: matches" in r.stdout and "speedup" in r.stdout


def test_worker_command_does_not_import_the_cli() -> None:
    """`advisor.worker` takes the shared options from `advisor.cli_args`: no import cycle."""
    probe = "import sys, advisor.worker; print('advisor.cli' in sys.modules)"
    r = python_code(probe)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
