"""Item 8 through the command: a space file that would silently do something else, and `advisor
show` telling the truth about a config that was edited or names an implementation unknown here."""

from __future__ import annotations

import json
from pathlib import Path
from subprocess import CompletedProcess

import pytest

import advisor
from advisor.config import Config, save_config
from advisor.device.environment import current_environment
from advisor.knobs import Settings
from tests._cli import advisor_cli_many, one_line_error

SPACE_HEAD = """schema_version: 1
name: hostile
device: cpu
"""


SPACE_MISTAKES = {
    "unknown-conv-impl": (
        "knobs:\n  conv_impl: [native, warp_speed]\n",
        ["unknown conv implementation 'warp_speed'", "known: native"],
    ),
    "min-above-max-samples": (
        "knobs:\n  amp: [off, bf16]\ntiming:\n  min_samples: 50\n  max_samples: 10\n",
        ["min_samples (50)", "max_samples (10)"],
    ),
    "skip-rule-bad-value": (
        "knobs:\n  amp: [off, bf16]\nskip:\n  - {amp: fp8}\n",
        ["skip rule", "'fp8'", "amp"],
    ),
    "skip-rule-bad-format": (
        "knobs:\n  amp: [off, bf16]\nskip:\n  - {memory_format: sideways}\n",
        ["skip rule", "'sideways'", "memory_format"],
    ),
}
SHOWN = {
    "edited-fingerprint": (Settings(), {"fingerprint": "0123456789abcdef"}),
    "edited-field": (Settings(), {"device_name": "Some Other CPU"}),
    "unknown-impl": (Settings(layers={"0": "unfold_gemm", "1": "warp_speed"}), {}),
    "matching": (Settings(), {}),
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, CompletedProcess[str]]]:
    """Every case through the CLI's `main`, in one fresh process: each case's file and result."""
    folder = tmp_path_factory.mktemp("quiet")
    cases: dict[str, list[str]] = {}
    files: dict[str, Path] = {}
    for key, (body, _) in SPACE_MISTAKES.items():
        space = folder / f"{key}.yaml"
        space.write_text(SPACE_HEAD + body)
        files[key] = folder / f"{key}-never.json"
        cases[key] = [
            "advise", "--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,8,8", "--device", "cpu",
            "--space", str(space), "--storage", "memory", "--out", str(files[key]),
        ]  # fmt: skip
    for key, (settings, changes) in SHOWN.items():
        files[key] = _config(folder / key, settings, **changes)
        cases[key] = ["show", str(files[key])]
    results = advisor_cli_many(cases)
    return {key: (files[key], results[key]) for key in cases}


@pytest.mark.parametrize("key", list(SPACE_MISTAKES))
def test_space_file_mistakes_are_one_line(
    ran: dict[str, tuple[Path, CompletedProcess[str]]], key: str
) -> None:
    out, r = ran[key]
    one_line_error(r, *SPACE_MISTAKES[key][1])
    assert not out.exists()


def _config(tmp_path: Path, settings: Settings, **env_changes: str) -> Path:
    env = current_environment("cpu").model_copy(update=env_changes)
    cfg = Config(
        advisor_version=advisor.__version__,
        mode="train",
        settings=settings,
        environment=env,
        workload={"kind": "layer", "description": "Conv2d"},
        space="cpu",
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    return save_config(cfg, tmp_path / "tuned.json")


Ran = dict[str, tuple[Path, CompletedProcess[str]]]


def test_show_does_not_trust_an_edited_fingerprint(ran: Ran) -> None:
    _, r = ran["edited-fingerprint"]
    assert r.returncode == 0, r.stderr
    assert "This machine: matches" not in r.stdout
    assert "This machine: differs" in r.stdout and "0123456789abcdef" in r.stdout


def test_show_compares_fields_not_the_stored_fingerprint(ran: Ran) -> None:
    # An edited field with the fingerprint left as it was: the fields decide.
    _, r = ran["edited-field"]
    assert r.returncode == 0, r.stderr
    assert "This machine: differs" in r.stdout and "Some Other CPU" in r.stdout


def test_show_names_implementations_unknown_here(ran: Ran) -> None:
    _, r = ran["unknown-impl"]
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "warp_speed" in x and "unknown" in x)
    assert "layer '1'" in line and "native" in line
    assert "This machine: matches" in r.stdout


def test_show_of_a_matching_config_still_matches(ran: Ran) -> None:
    path, r = ran["matching"]
    assert r.returncode == 0 and "This machine: matches" in r.stdout
    assert json.loads(path.read_text())["environment"]["fingerprint"] in r.stdout
