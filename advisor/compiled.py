"""torch.compile for a tuned model, and the compiler state its measurement needs.

`compile_model` is the last thing `advisor.apply` does (after flags, layout and conv swaps): what
was measured is what runs. The rest is for measuring:

- `recompile_guard`: Dynamo's recompile limit made an error, so a model that recompiles on every
  call (a guard on a changing Python value) is a failed candidate with that reason instead of a
  silent fall back to eager after the limit.
- `inductor_caches`: Inductor's on-disk cache at a given folder, its in-memory caches cleared on
  the way in and out. A compile's *cold* cost is its first call with an empty folder; a *warm*
  compile, in a fresh Dynamo state with the folder filled, is a training run that starts again
  on the same machine. Without clearing the in-memory caches, a second compile in the same
  process is neither: it reads them, several times faster than a warm compile.
- `measurement_cache`: this process's folder that every measured compile's artifacts are merged
  into: the re-time and the final check compile warm from it instead of paying a cold compile
  again.

This module imports neither optuna nor pandas (`advisor.apply` uses it).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advisor.device.ops import placement
from advisor.knobs import Settings

__all__ = [
    "CACHE_ENV",
    "cache_reads",
    "cold_cache",
    "compile_model",
    "graph_breaks",
    "inductor_caches",
    "keep_artifacts",
    "leave_for_training",
    "measurement_cache",
    "recompile_guard",
    "recompile_limit",
    "recompile_reason",
    "shared_measurement_cache",
    "start_inductor",
    "training_cache",
]

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # Inductor's on-disk cache (FX graphs, C++/Triton kernels)
# Compiles of one model's forward allowed per measurement before it counts as recompiling
# endlessly: one per shape of a shape set, one more for a capture under the gate's dropout mode,
# and slack for a guard that fails once (Dynamo's own default is 8).
BASE_RECOMPILES = 8


def compile_model(model: nn.Module, settings: Settings) -> nn.Module:
    """`model` wrapped in `torch.compile` with the settings' mode (the model itself when off).
    Nothing compiles until the first call."""
    if not settings.compiled:
        return model
    return torch.compile(model, mode=settings.compile, dynamic=settings.compile_dynamic)  # type: ignore[return-value]


def recompile_limit(cases: int) -> int:
    """How many compiles of a model's forward a measurement over `cases` shapes allows."""
    return BASE_RECOMPILES + 2 * cases


@contextlib.contextmanager
def recompile_guard(cases: int = 1) -> Iterator[None]:
    """Within it, a compiled model that recompiles more than `recompile_limit(cases)` times
    raises (`fail_on_recompile_limit_hit`) instead of running on in eager mode: a failed
    candidate (`recompile_reason` says why), never a silent eager one. Dynamo names the function
    and its last guard failure only in a log warning: kept for the reason."""
    _LIMIT_HIT.clear()
    log = logging.getLogger("torch._dynamo.convert_frame")
    handler = _LimitHitHandler()
    log.addHandler(handler)
    try:
        with torch._dynamo.config.patch(
            recompile_limit=recompile_limit(cases), fail_on_recompile_limit_hit=True
        ):
            yield
    finally:
        log.removeHandler(handler)


_LIMIT_HIT: list[tuple[str, str]] = []  # (function, Dynamo's last recompile reason)


class _LimitHitHandler(logging.Handler):
    """Keeps what Dynamo's 'hit config.recompile_limit' warning names (torch 2.4-2.13: its
    arguments are the limit's name, its value, the function, the last reason)."""

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("torch._dynamo hit config.") and len(args) >= 4:
            _LIMIT_HIT.append((str(args[2]), str(args[3])))


def recompile_reason(error: BaseException, cases: int = 1) -> str | None:
    """The reason to give when `error` is Dynamo hitting the recompile limit; else None."""
    e: BaseException | None = error
    while e is not None:
        if type(e).__name__ == "FailOnRecompileLimitHit":
            what, why = "the model", ""
            if _LIMIT_HIT:
                func, last = _LIMIT_HIT[-1]
                what, why = f"{func.split(' (')[0]} ({_short_place(func)})", f"; its last: {last}"
            return (
                f"torch.compile recompiled {what} more than {recompile_limit(cases)} times (the "
                f"measurement's recompile limit{why}): Dynamo compiles a function again for each "
                "variant its guards tell apart, e.g. a Python value that changes per step, or one "
                "forward broken by a graph break and called by many layers; past its own limit "
                "PyTorch runs the rest eagerly, which is not what was measured"
            )
        e = e.__cause__ or e.__context__
    return None


def graph_breaks(limit: int = 20) -> list[str]:
    """Where Dynamo broke the model's graph since its last reset, each place once, in order:
    'file.py:123: its reason's first line'. Why a compile saves little is often here (EnCodec:
    a break in its padding helper, then one graph per conv layer). Empty where Dynamo keeps no
    record (another torch version)."""
    try:
        from torch._dynamo.utils import graph_break_reasons
    except ImportError:  # pragma: no cover - another torch version
        return []
    places: list[str] = []
    for r in list(graph_break_reasons):
        frame = r.user_stack[-1] if getattr(r, "user_stack", None) else None
        where = f"{Path(frame.filename).name}:{frame.lineno}" if frame is not None else "?"
        why = next((line.strip() for line in str(r.reason).splitlines() if line.strip()), "?")
        place = f"{where}: {why[:200]}"
        if place not in places:
            places.append(place)
        if len(places) >= limit:
            break
    return places


def cache_reads() -> tuple[int, int] | None:
    """Graphs this process has read from Inductor's and AOTAutograd's caches, and graphs it
    compiled because they were not there: (hits, misses) so far. None where Inductor's graph
    cache is off (nothing is read) or this torch keeps no such counts."""
    try:
        from torch._dynamo.utils import counters
        from torch._inductor import config
    except ImportError:  # pragma: no cover - another torch version
        return None
    if not config.fx_graph_cache:
        return None
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return (inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"],
            inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"])  # fmt: skip


def _short_place(func: str) -> str:
    """'file.py:162' from Dynamo's "'name' (/long/path/file.py:162)"."""
    inside = func[func.rfind("(") + 1 : func.rfind(")")] if "(" in func else func
    return Path(inside.rsplit(":", 1)[0]).name + ":" + inside.rsplit(":", 1)[-1]


def _clear_in_memory() -> Any:
    """Inductor's helper that points its caches at a folder and clears the in-memory ones (the
    one torch's own tests use for a cold compile); None where this torch has none (then only
    the folder changes, and a second compile in a process reads as faster than it is)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    except ImportError:  # pragma: no cover - another torch version
        return None
    return temporary_cache_dir


_STARTED = False


def start_inductor(device: torch.device | None = None) -> float:
    """Inductor's one-off start in a process, paid on a trivial function on the run's device
    (the CPU when None): every measured compile is then the model's own, whichever candidate
    comes first, and its cold cache holds the model's artifacts alone. Returns the seconds it
    took (0 when this process had started it). It starts in the folder the user's own
    `torch.compile` reads (`training_cache()`): Inductor keys its start-up artifacts by content,
    so a machine where torch.compile ran before starts warm, and the user's does after a run.

    The start is the device's backend's: its imports, then on a CPU the C++ compiler's checks of
    each instruction set (`_check_instruction_sets`) and the precompiled header, on a GPU Triton's
    start and its first kernel (Inductor reads instruction sets only for C++ kernels and AOT
    builds: a GPU graph never reads the checks a CPU function would pay)."""
    global _STARTED
    if _STARTED:
        return 0.0
    _STARTED = True
    t0 = time.perf_counter()
    folder = training_cache()
    folder.mkdir(parents=True, exist_ok=True)
    on = placement(device) if device is not None else torch.device("cpu")
    with inductor_caches(folder):
        if on.type == "cpu":
            _check_instruction_sets()
        torch.compile(lambda x: x + 1)(torch.ones(2, device=on))
    torch.compiler.reset()
    return time.perf_counter() - t0


def _check_instruction_sets() -> None:
    """Inductor's checks of the CPU's instruction sets (a test library compiled and loaded for
    each, seconds apiece), side by side, one per core: its own, one at a time, reads the answers."""
    try:
        from torch._inductor import cpu_vec_isa as vec
        has = vec.x86_isa_checker()
        isas = [i for i in vec.supported_vec_isa_list if all(f in has for f in str(i).split())]
    except Exception:  # noqa: BLE001 - another torch version: Inductor checks them itself
        return
    with ThreadPoolExecutor(max(1, min(len(isas), os.cpu_count() or 1))) as pool:
        list(pool.map(bool, isas))


@contextlib.contextmanager
def inductor_caches(folder: str | Path) -> Iterator[None]:
    """Inductor's caches at `folder` within (Dynamo's state reset first: every compile in it
    starts from a fresh trace)."""
    torch.compiler.reset()
    helper = _clear_in_memory()
    if helper is not None:
        with helper(str(folder)):
            yield
        return
    with _environ(CACHE_ENV, str(folder)):  # pragma: no cover - another torch version
        yield


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """The environment variable `name` set to `value` within, put back after."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


SHARED_ENV = "ADVISOR_COMPILE_CACHE"  # a run's folder, shared with its workers and final check
_ROOT: Path | None = None


def _root() -> Path:
    """This process's folder for compile caches: the run's shared one when it has one (so the
    final check in a fresh process compiles warm from what the worker compiled), else its own,
    removed at exit."""
    global _ROOT
    shared = os.environ.get(SHARED_ENV)
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="advisor-inductor-"))
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


@contextlib.contextmanager
def shared_measurement_cache() -> Iterator[Path]:
    """Within it, processes started from this one (workers, the final check) share one folder
    of compile caches with it (yielded); removed after."""
    folder = tempfile.mkdtemp(prefix="advisor-inductor-")
    try:
        with _environ(SHARED_ENV, folder):
            yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def training_cache() -> Path:
    """The Inductor cache folder the user's own `torch.compile` reads in a process started like
    this one: `TORCHINDUCTOR_CACHE_DIR` where set, else Inductor's default (read without
    Inductor's `cache_dir()`, which sets the variable as it reads it)."""
    return Path(os.environ.get(CACHE_ENV) or _inductor_default_cache_dir()).absolute()


def _inductor_default_cache_dir() -> str:
    """Inductor's own `default_cache_dir()`, from its file, without importing the `torch._inductor`
    package where no one has: that import costs the advisor's process seconds on a small CPU, at
    the end of every run that picked a compile. The file imports nothing of Inductor's."""
    name = "torch._inductor.runtime.cache_dir_utils"
    module: Any = sys.modules.get(name)
    if module is None:
        path = Path(torch.__file__).parent / "_inductor" / "runtime" / "cache_dir_utils.py"
        spec = importlib.util.spec_from_file_location("_advisor_inductor_cache_dir", path)
        if not path.is_file() or spec is None or spec.loader is None:  # laid out otherwise
            module = importlib.import_module(name)
        else:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    return str(module.default_cache_dir())


def leave_for_training(run_folder: Path) -> Path | None:
    """Copy a run's compile artifacts (`run_folder`, from `shared_measurement_cache`) into
    `training_cache()`, beside Inductor's start-up ones (`start_inductor`): the user's first
    training step compiles the recommendation from them, as the final check's fresh process did.
    Inductor's caches are keyed by content: only a compile they fit reads them. Returns the
    folder, or None where there was nothing to copy or the copy failed."""
    warm = run_folder / "warm"
    if not warm.is_dir() or not any(warm.iterdir()):
        return None
    target = training_cache()
    return target if _merge(warm, target) else None


def measurement_cache() -> Path:
    """This process's Inductor cache for re-compiles of measured candidates (removed at exit)."""
    warm = _root() / "warm"
    warm.mkdir(exist_ok=True)
    return warm


def cold_cache() -> Path:
    """An empty folder for one cold compile (its artifacts are kept with `keep_artifacts`)."""
    return Path(tempfile.mkdtemp(prefix="cold-", dir=_root()))


def _merge(folder: Path, into: Path) -> bool:
    """Copy `folder`'s files into `into`, but for those `into` has already; whether the copy
    succeeded. A file of the same name is the same artifact (Inductor names them by what made
    them), and one this process has loaded must not be rewritten under it: a kernel library
    rewritten in place crashes the process that runs it."""

    def new_only(src: str, dst: str) -> None:
        if not os.path.exists(dst):
            shutil.copy2(src, dst)

    try:
        shutil.copytree(folder, into, dirs_exist_ok=True, copy_function=new_only)
    except (OSError, shutil.Error):
        return False
    return True


def keep_artifacts(cold: Path) -> None:
    """Merge a cold compile's artifacts into `measurement_cache()` and remove its folder."""
    _merge(cold, measurement_cache())
    shutil.rmtree(cold, ignore_errors=True)
