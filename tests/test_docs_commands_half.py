"""The other half of the docs pages' commands (tests/test_docs_commands.py says how each runs):
a file of its own, so that the suite's two workers share the blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_docs_commands import HALVES, Block, _param, run_block
from tests.test_docs_commands import tuned_json as tuned_json  # the module's fixture, here too


@pytest.mark.parametrize("block", [_param(b) for b in HALVES[1]])
def test_the_docs_command_runs(block: Block, tmp_path: Path, tuned_json: Path) -> None:
    run_block(block, tmp_path, tuned_json)
