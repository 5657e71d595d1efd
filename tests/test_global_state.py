"""Putting PyTorch's process-wide state back between candidates."""

from __future__ import annotations

from pathlib import Path

import torch

from advisor.device.global_state import global_state, restore_global_state
from tests._cli import python_code
from tests.conftest import run_env

_FRESH = """
import sys, torch
from advisor.device.global_state import global_state, restore_global_state
saved = global_state()
torch.set_grad_enabled(False)  # a candidate's step left something changed
restore_global_state(saved)
assert torch.is_grad_enabled()
from advisor.compiled import training_cache
folder = training_cache()
print("torch._inductor" in sys.modules)
print(folder)
"""


def test_putting_the_state_back_and_naming_the_cache_folder_do_not_import_inductor() -> None:
    # torch.use_deterministic_algorithms imports Inductor's config: 2.1 s of every re-timing
    # worker and final check on 2 cores, in processes that compiled nothing. And importing
    # torch._inductor only to name the folder a run leaves its compile caches in cost 2.5 s at
    # the end of every run that picked a compile.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    env = {k: v for k, v in run_env().items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    r = python_code(_FRESH, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    imported, folder = r.stdout.split()
    assert imported == "False"
    assert Path(folder) == Path(default_cache_dir()).absolute()  # Inductor's own default


def test_deterministic_algorithms_a_step_switched_on_are_switched_off_again() -> None:
    saved = global_state()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        restore_global_state(saved)
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
