"""A framework that cannot be imported makes its integration tests skip with the reason, never
error (issue 65): here a torchvision whose compiled ops do not load beside this torch, which
torchmetrics (and so Lightning) and transformers' Trainer import. A real pytest run of the two
integration test files, in a subprocess whose `import torchvision` raises as that one does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_env

ROOT = Path(__file__).resolve().parent.parent
FILES = ["tests/test_integrations_lightning.py", "tests/test_integrations_hf.py"]
BROKEN = "operator torchvision::nms does not exist"


def _broken_torchvision(folder: Path) -> None:
    """A torchvision that is installed (its metadata says so, as libraries check before they
    import it) and raises at import what a build for another torch raises."""
    (folder / "torchvision").mkdir()
    (folder / "torchvision" / "__init__.py").write_text(f"raise RuntimeError({BROKEN!r})\n")
    meta = folder / "torchvision-0.99.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.99.0\n")


@pytest.mark.slow  # a pytest run of two files in a subprocess (about 20 s on 2 cores)
def test_a_framework_that_raises_at_import_skips_its_tests_with_the_reason(
    tmp_path: Path,
) -> None:
    for name in ("lightning", "transformers"):
        pytest.importorskip(name)  # the frameworks themselves must be here to be broken
    _broken_torchvision(tmp_path)
    env = run_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-rs", "-p", "no:cacheprovider", *FILES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout
    # Both files skip at their import, so pytest collects no test (exit 5); a failure or a
    # collection error would exit 1 or 2.
    assert done.returncode == 5, out[-3000:]
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"=*\s*2 skipped in [\d.]+s\s*=*", summary), summary
    for name, page in (("lightning", FILES[0]), ("transformers", FILES[1])):
        line = next(ln for ln in out.splitlines() if ln.startswith("SKIPPED") and page in ln)
        assert f"{name} does not import here: RuntimeError: {BROKEN}" in line, line
