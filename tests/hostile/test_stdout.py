"""Item 6: with --json --quiet, stdout is the config's JSON and nothing else, even when the
user's model prints (at import, in build_model, in forward; through Python's print and straight
to file descriptor 1), in this process or in the isolated worker processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import advisor_cli

CHATTY_MODEL = """
import os
import torch
from torch import nn

print("chatty: imported")
os.write(1, b"chatty: imported, at the C level\\n")


class Chatty(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        print("chatty: forward")
        os.write(1, b"chatty: forward, at the C level\\n")
        return self.conv(x)


def build_model():
    print("chatty: build_model")
    return Chatty()


def example_inputs():
    print("chatty: example_inputs")
    return (torch.randn(1, 3, 8, 8),)
"""


# isolated: 10 s (test_clean_exit runs the isolated CLI); in-process: 7 s
@pytest.mark.parametrize(
    "isolation",
    [pytest.param([], marks=pytest.mark.slow), ["--in-process"]],
    ids=["isolated", "in-process"],
)
def test_json_stdout_is_only_the_config(
    tmp_path: Path, fast_space: str, isolation: list[str]
) -> None:
    model = tmp_path / "chatty.py"
    model.write_text(CHATTY_MODEL)
    out = tmp_path / "tuned.json"
    r = advisor_cli(
        "advise", str(model), "--device", "cpu", "--space", fast_space, "--storage", "memory",
        "--out", str(out), "--json", "--quiet", *isolation,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout) == json.loads(out.read_text())
    # What the model printed is not lost: it went to stderr, from this process and the workers.
    assert "chatty: forward" in r.stderr and "chatty: forward, at the C level" in r.stderr
    assert "chatty: imported, at the C level" in r.stderr
