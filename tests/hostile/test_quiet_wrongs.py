"""Item 8 through the command: a space file that would silently do something else, and `advisor
show` telling the truth about a config that was edited or names an implementation unknown here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import advisor
from advisor.config import Config, save_config
from advisor.environment import current_environment
from advisor.knobs import Settings
from tests.hostile._cli import advisor_cli, one_line_error

SPACE_HEAD = """schema_version: 1
name: hostile
device: cpu
"""


@pytest.mark.parametrize(
    "body,needles",
    [
        pytest.param(
            "knobs:\n  conv_impl: [native, warp_speed]\n",
            ["unknown conv implementation 'warp_speed'", "known: native"],
            id="unknown-conv-impl",
        ),
        pytest.param(
            "knobs:\n  amp: [off, bf16]\ntiming:\n  min_samples: 50\n  max_samples: 10\n",
            ["min_samples (50)", "max_samples (10)"],
            id="min-above-max-samples",
        ),
        pytest.param(
            "knobs:\n  amp: [off, bf16]\nskip:\n  - {amp: fp8}\n",
            ["skip rule", "'fp8'", "amp"],
            id="skip-rule-bad-value",
        ),
        pytest.param(
            "knobs:\n  amp: [off, bf16]\nskip:\n  - {memory_format: sideways}\n",
            ["skip rule", "'sideways'", "memory_format"],
            id="skip-rule-bad-format",
        ),
    ],
)
def test_space_file_mistakes_are_one_line(tmp_path: Path, body: str, needles: list[str]) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE_HEAD + body)
    out = tmp_path / "never.json"
    r = advisor_cli(
        "advise", "--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,8,8", "--device", "cpu",
        "--space", str(space), "--storage", "memory", "--out", str(out),
    )  # fmt: skip
    one_line_error(r, *needles)
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
    return save_config(cfg, tmp_path / "tuned.json")


def test_show_does_not_trust_an_edited_fingerprint(tmp_path: Path) -> None:
    path = _config(tmp_path, Settings(), fingerprint="0123456789abcdef")
    r = advisor_cli("show", str(path))
    assert r.returncode == 0, r.stderr
    assert "This machine: matches" not in r.stdout
    assert "This machine: differs" in r.stdout and "0123456789abcdef" in r.stdout


def test_show_compares_fields_not_the_stored_fingerprint(tmp_path: Path) -> None:
    # An edited field with the fingerprint left as it was: the fields decide.
    path = _config(tmp_path, Settings(), device_name="Some Other CPU")
    r = advisor_cli("show", str(path))
    assert r.returncode == 0, r.stderr
    assert "This machine: differs" in r.stdout and "Some Other CPU" in r.stdout


def test_show_names_implementations_unknown_here(tmp_path: Path) -> None:
    path = _config(tmp_path, Settings(layers={"0": "unfold_gemm", "1": "warp_speed"}))
    r = advisor_cli("show", str(path))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "warp_speed" in x and "unknown" in x)
    assert "layer '1'" in line and "native" in line
    assert "This machine: matches" in r.stdout


def test_show_of_a_matching_config_still_matches(tmp_path: Path) -> None:
    path = _config(tmp_path, Settings())
    r = advisor_cli("show", str(path))
    assert r.returncode == 0 and "This machine: matches" in r.stdout
    assert json.loads(path.read_text())["environment"]["fingerprint"] in r.stdout
