"""Shared fixtures. GPU tests skip without CUDA; PostgreSQL tests skip without the server."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# Two xdist workers on two cores, each running torch (and the advisor's children) with OpenMP's
# threads: libgomp's threads spin while they wait by default, and one process's spinning took
# the other's core. Passive waiting, set before torch loads libgomp (the workers and every
# subprocess inherit it): the whole suite on a 2-core Zen 4 EPYC 649 s to 496 s, user CPU
# 18.5 to 13.4 minutes, the same verdicts (2026-11-27). Thread counts stay as they are.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

import advisor
from advisor.config import Config
from advisor.device.environment import current_environment
from advisor.execute import runner
from advisor.knobs import Settings
from tests._cli import python_code, run_env

# Property tests explore fixed example sequences: CI must not fail on a new random draw.
settings.register_profile("advisor", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "advisor"))

DATA = Path(__file__).parent / "data"
FAST_SPACE = str(DATA / "fast_cpu.yaml")
CUDA_STANDIN = "tests.standins.cuda_on_cpu:CudaOnCpu"


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            return True
    except OSError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA device; none here")
    no_pg = pytest.mark.skip(reason="needs PostgreSQL on 127.0.0.1:5432 (runs in CI)")
    has_gpu = torch.cuda.is_available()
    has_pg = _postgres_up()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(no_gpu)
        if "postgres" in item.keywords and not has_pg:
            item.add_marker(no_pg)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored studies go to a temporary cache, never the user's."""
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def _nothing_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's compiled candidates compile cold: a graph an earlier test compiled in this
    process for the same model is not read from its caches (`execute.runner._compiled`)."""
    monkeypatch.setattr(runner, "_COMPILED", {})


@pytest.fixture(autouse=True)
def _threads_kept() -> Iterator[None]:
    """A test that leaves torch's thread count changed makes every later config record another
    environment (a mismatch warning, a report without its roofline): fail it where it happens."""
    threads = torch.get_num_threads()
    yield
    left = torch.get_num_threads()
    if left != threads:
        torch.set_num_threads(threads)
        pytest.fail(f"the test left torch's thread count at {left} (was {threads})")


@pytest.fixture
def fast_space() -> str:
    return FAST_SPACE


@pytest.fixture
def small_model_file() -> str:
    return str(DATA / "tiny_cnn.py")


@pytest.fixture
def precision_checks_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The precision of each training check the gate runs from now on (the real check, counted
    as `advisor.gate.numeric` calls it)."""
    from advisor.gate import numeric

    calls: list[str] = []
    real = numeric.check_precision

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(str(args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(numeric, "check_precision", counted)
    return calls


def load_script(path: Path, name: str) -> ModuleType:
    """A benchmark script imported as module `name`, for testing its functions (registered in
    sys.modules first: a dataclass in it looks its module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> None:
    """The children's fork server, started before any test changes the environment: one started
    inside a test that set PYTHONPATH (`cuda_standin`) would have every later child spawned (its
    environment differs where torch's import reads it), at an import of torch each. optuna's
    importance module is imported first: it imports scikit-learn, which sets `KMP_*` in this
    process's environment as it loads, so every child after a report test would be spawned."""
    import optuna.importance  # noqa: F401 - for what its import sets

    from advisor.execute.children import start_server

    start_server()


def in_fresh_process(body: Callable[..., None], *args: str, timeout_s: float = 300) -> None:
    """Run `body(*args)`, a test module's function, in a fresh Python process and fail with its
    stderr where it fails: the test runner's history (other tests' garbage, threads, caches)
    does not count, and a crash fails one test, with faulthandler's stack, not the runner."""
    code = f"from {body.__module__} import {body.__name__} as f; f(*{args!r})"
    run = python_code(code, timeout=timeout_s)
    assert run.returncode == 0, run.stderr[-4000:]


@pytest.fixture
def cuda_standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The advisor talks to the CPU stand-in for CUDA (tests/standins/cuda_on_cpu.py), here and
    in the workers it spawns; yields the stand-in's call log. Proves control flow, not speed."""
    from advisor.device.environment import _environment
    from advisor.device.ops import cuda_ops

    log = tmp_path / "standin.log"
    monkeypatch.setenv("ADVISOR_DEVICE_OPS", CUDA_STANDIN)
    monkeypatch.setenv("ADVISOR_STANDIN_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", run_env()["PYTHONPATH"])  # workers import tests.standins
    cuda_ops.cache_clear()
    _environment.cache_clear()
    yield log
    cuda_ops.cache_clear()
    _environment.cache_clear()


def cpu_config(picked: Settings, mode: str = "train") -> Config:
    """A config as `advisor advise` would write it on this CPU, with `picked` recommended."""
    return Config(
        advisor_version=advisor.__version__,
        mode=mode,  # type: ignore[arg-type]
        settings=picked,
        environment=current_environment("cpu"),
        workload={"kind": "model", "description": "test"},
        space="cpu",
    )


def as_searched(study: Any, min_gain: float = 0.02, record_format: int | None = None) -> None:
    """A hand-made study marked with the attributes `advise` stores on a new one
    (`advisor.search.study`): the report reads them."""
    from advisor.search.ledger import RECORD_FORMAT

    attrs = {
        "record_format": RECORD_FORMAT if record_format is None else record_format,
        "workload": {
            "kind": "model",
            "target": "<Net>",
            "architecture": "0",
            "description": "",
            "input_shapes": [[2, 3, 8, 8]],
        },
        "mode": "train",
        "space": "cpu",
        "min_gain": min_gain,
        "environment": current_environment("cpu").model_dump(mode="json"),
    }
    for key, value in attrs.items():
        study.set_user_attr(key, value)


def capture_on_cpu(workload: Any, settings: Settings, seed: int = 0) -> Any:
    """One training step of `settings` on `workload` as the gate captures it, on the CPU."""
    from advisor.measure.candidate import Candidate

    cand = Candidate(workload, settings, torch.device("cpu"), "train", seed=seed)
    try:
        return cand.capture()
    finally:
        cand.close()


class FakeClock:
    """Advances by a scripted duration each time the step runs (the last one repeats): exact
    statistics, whatever else runs on the machine."""

    def __init__(self, durations_s: list[float]) -> None:
        self.now = 0.0
        self.durations = list(durations_s)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1
