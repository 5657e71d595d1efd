"""Where timm cannot be imported, for any reason, its tests are skipped with the reason.

Issue 56: timm installed beside a torchvision that does not load with this torch (`operator
torchvision::nms does not exist`, a RuntimeError) gave 12 errors in test_library_convs.py, whose
fixture caught ImportError only. Here a timm and a torchvision that raise RuntimeError on import
shadow whatever is installed, and the timm tests run in a subprocess that sees them first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import run_env

BROKEN = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


def test_a_timm_that_raises_on_import_skips_its_tests_with_the_reason(tmp_path: Path) -> None:
    for package in ("torchvision", "timm", "timm/layers"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text(BROKEN)
    env = run_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    test_file = Path(__file__).parent / "test_library_convs.py"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-n0", "-p", "no:cacheprovider",
         str(test_file), "-k", "timm"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # "11 skipped, 9 deselected in 0.29s", pytest's last line on stdout (plugins' warnings may
    # follow it on stderr)
    summary = r.stdout.strip().splitlines()[-1]
    assert "error" not in summary and "failed" not in summary and "passed" not in summary, out
    skipped = re.search(r"(\d+) skipped", summary)
    assert skipped is not None and int(skipped.group(1)) >= 10, out
    # the reason names what failed: the package's import, then its conv modules alone
    assert "timm does not import here (RuntimeError: operator torchvision::nms" in out, out
