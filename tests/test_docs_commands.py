"""Every fenced command in README.md and docs/*.md runs: one test per ```bash or ```python block.

Each block runs in a fresh temporary folder holding links to the repository's top-level folders
(so `advisor/examples/small_cnn.py` resolves as in a checkout) and a `tuned.json` (channels_last +
bf16, tuned on this machine) for the blocks that apply a config. `advisor`, `python` and
`python3` run this test's Python; `ADVISOR_CACHE_DIR` points into the folder, so no study is
shared with the user's cache. bash blocks run under `bash -euo pipefail`, python blocks as a
script. Lines that install the project or run the test suite (`python3 -m pip install`,
`python3 -m pytest`) are left out: `.ci/run` runs the README's, and pytest inside pytest would
recurse.

An HTML comment on the line before a block says how it runs (docs/development.md):
- `<!-- slow: reason -->`: the test is marked `slow` (left out of the default run);
- `<!-- not-run: reason -->`: skipped, with the reason (a GPU, a database server, a fragment);
- `<!-- run-by: tests/test_x.py (test) -->`: another test runs it; that file must name the page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>[\w-]+)\s*:\s*(?P<reason>.*?)\s*-->\s*$")
KINDS = ("slow", "not-run", "run-by")
RUN = ("bash", "python")
# Fences that hold commands under another name would escape this test: write them as bash.
NOT_COMMANDS = ("", "text", "yaml", "json", "toml", "layers")
CI_LINES = re.compile(r"^\s*python3? -m (pip install|pytest)\b")
LINKED = ("advisor", "benchmarks", "notebooks", "scripts", "search_spaces", "tests")
FAST_TIMEOUT_S = 300
SLOW_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the fence's line, 1-based
    lang: str
    code: str
    kind: str | None  # the marker before it, if any
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _marker(text: str, start: int) -> tuple[str | None, str]:
    """The marker on the last non-blank line before offset `start`."""
    for line in reversed(text[:start].splitlines()):
        if line.strip():
            m = MARKER.match(line)
            return (m["kind"], m["reason"]) if m else (None, "")
    return None, ""


def fenced(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        kind, reason = _marker(text, m.start())
        out.append(
            Block(
                page=page.relative_to(ROOT).as_posix(),
                line=text.count("\n", 0, m.start()) + 1,
                lang=m["lang"],
                code=textwrap.dedent(m["body"]),
                kind=kind,
                reason=reason,
            )
        )
    return out


BLOCKS = [b for page in PAGES for b in fenced(page)]
COMMANDS = [b for b in BLOCKS if b.lang in RUN]


def _param(b: Block) -> object:
    marks: list[pytest.MarkDecorator] = []
    if b.kind == "slow":
        marks.append(pytest.mark.slow)
    elif b.kind == "not-run":
        marks.append(pytest.mark.skip(reason=f"not run: {b.reason}"))
    elif b.kind == "run-by":
        marks.append(pytest.mark.skip(reason=f"run by {b.reason}"))
    return pytest.param(b, id=b.id, marks=marks)


def _runnable(code: str) -> str:
    return "\n".join(line for line in code.splitlines() if not CI_LINES.match(line))


@pytest.fixture(scope="module")
def tuned_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config the blocks that apply one read: channels_last + bf16, on this machine."""
    from advisor.config import save_config
    from advisor.knobs import Settings
    from tests.conftest import cpu_config

    path = tmp_path_factory.mktemp("config") / "tuned.json"
    save_config(cpu_config(Settings(memory_format="channels_last", amp="bf16")), path)
    return path


def _folder(tmp: Path, tuned_json: Path) -> dict[str, str]:
    """Make `tmp` look like a checkout with a tuned.json; the environment the block runs in."""
    for name in LINKED:
        (tmp / name).symlink_to(ROOT / name, target_is_directory=True)
    (tmp / "tuned.json").write_text(tuned_json.read_text())
    shims = tmp / ".shims"
    shims.mkdir()
    for name, line in (
        ("advisor", f'exec "{sys.executable}" -m advisor "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
        ("python3", f'exec "{sys.executable}" "$@"'),
    ):
        shim = shims / name
        shim.write_text(f"#!/bin/sh\n{line}\n")
        shim.chmod(0o755)
    env = dict(os.environ)
    env.update(
        PATH=f"{shims}{os.pathsep}{env.get('PATH', '')}",
        ADVISOR_CACHE_DIR=str(tmp / ".cache"),
        PYTHONUNBUFFERED="1",
    )
    return env


# Half the pages' blocks run from tests/test_docs_commands_half.py: xdist keeps a file on one
# worker, and the blocks are the suite's longest file; in two files both workers share them.
_ORDER = [str(p.relative_to(ROOT)) for p in PAGES]
HALVES = ([b for b in COMMANDS if _ORDER.index(b.page) % 2 == 0],
          [b for b in COMMANDS if _ORDER.index(b.page) % 2 == 1])  # fmt: skip


@pytest.mark.parametrize("block", [_param(b) for b in HALVES[0]])
def test_the_docs_command_runs(block: Block, tmp_path: Path, tuned_json: Path) -> None:
    run_block(block, tmp_path, tuned_json)


def run_block(block: Block, tmp_path: Path, tuned_json: Path) -> None:
    """Run one block as the module's docstring says, and fail with its output if it fails."""
    code = _runnable(block.code)
    if not code.strip():
        pytest.skip("only install and test lines, which .ci/run runs")
    env = _folder(tmp_path, tuned_json)
    if block.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    else:
        (tmp_path / "block.py").write_text(code)
        cmd = [sys.executable, "block.py"]
    timeout = SLOW_TIMEOUT_S if block.kind == "slow" else FAST_TIMEOUT_S
    done = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}:\n{code}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-5000:]}"
    )


def test_every_marker_is_known_and_stands_before_a_block() -> None:
    starts = {(b.page, b.line) for b in BLOCKS}
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARKER.match(line)
            if m is None:
                continue
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            assert m["kind"] in KINDS, f"{where}: unknown marker {m['kind']!r}; use {KINDS}"
            assert m["reason"], f"{where}: a marker gives its reason"
            nxt = next(
                j for j in range(i + 1, len(lines) + 1) if j == len(lines) or lines[j].strip()
            )
            rel = page.relative_to(ROOT).as_posix()
            assert (rel, nxt + 1) in starts, f"{where}: the marker is not followed by a block"


def test_commands_are_fenced_as_bash_or_python() -> None:
    other = [f"{b.id} ({b.lang})" for b in BLOCKS if b.lang not in RUN + NOT_COMMANDS]
    assert not other, f"fence commands as bash or python, so that they run here: {other}"


@pytest.mark.parametrize("block", [b for b in COMMANDS if b.kind == "run-by"], ids=lambda b: b.id)
def test_a_block_run_elsewhere_names_a_test_that_reads_its_page(block: Block) -> None:
    path = block.reason.split()[0]
    test = ROOT / path
    assert test.is_file(), f"{block.id}: {path} does not exist"
    assert Path(block.page).name in test.read_text(), f"{block.id}: {path} does not read its page"


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; reference belongs in docs/"


def test_every_docs_link_resolves() -> None:
    link = re.compile(r"\]\((?!https?:|#)([^)#\s]+)(?:#[^)]*)?\)")
    for page in PAGES:
        for target in link.findall(page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target} not found"
