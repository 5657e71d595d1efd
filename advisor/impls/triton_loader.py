"""Loading Triton and the conv kernels, lazily, and saying why they cannot run here.

TRITON_INTERPRET is read by `triton.jit` when a kernel is decorated, so the kernels (in
`_triton_kernels.py`) are loaded on first use, once per value of TRITON_INTERPRET: set it before
the first call, not necessarily before the import.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from types import ModuleType

import torch

from advisor.device.ops import cuda_ops
from advisor.errors import first_line

__all__ = [
    "device_problem",
    "interpreting",
    "kernels",
    "kernels_problem",
    "triton_import_problem",
]

_MIN_TRITON = (3, 4)  # the kernel module reads triton.knobs, new in Triton 3.4
_KERNELS: dict[bool, ModuleType] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_import_problem() -> str | None:
    """None if triton imports, else why not (cached: an import is not retried)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'conv-advisor[triton]')"
    try:
        import triton  # noqa: F401
    except Exception as exc:  # a broken install raises anything, not only ImportError
        return f"triton does not import: {type(exc).__name__}: {exc}"
    return None


def kernels() -> ModuleType:
    """The kernel module, decorated under the current TRITON_INTERPRET setting."""
    interpret = interpreting()
    module = _KERNELS.get(interpret)
    if module is None:
        problem = triton_import_problem()
        if problem is not None:
            raise RuntimeError(problem)
        name = f"advisor.impls._triton_kernels_{'interpreted' if interpret else 'compiled'}"
        path = os.path.join(os.path.dirname(__file__), "_triton_kernels.py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _KERNELS[interpret] = module
    return module


def _version(text: str) -> tuple[int, ...]:
    """(major, minor) of a version such as '3.4.0+git1234' or '3.10.0rc1'; () if unreadable."""
    parts = [re.match(r"\d+", piece) for piece in text.split(".")[:2]]
    if len(parts) != 2 or any(m is None for m in parts):
        return ()
    return tuple(int(m.group()) for m in parts if m is not None)


@functools.cache
def kernels_problem(interpret: bool) -> str | None:
    """None if the kernels load under this TRITON_INTERPRET value, else why not, as one line.

    Cached per value: the first call decorates the kernels (once), later calls are free. Call it
    with `interpreting()`, the value `kernels()` reads.
    """
    problem = triton_import_problem()
    if problem is not None:
        return problem
    import triton

    version = str(getattr(triton, "__version__", "?"))
    if () < _version(version) < _MIN_TRITON:  # an unreadable version: let the load decide
        need = ".".join(map(str, _MIN_TRITON))
        return f"triton {version} is too old: the kernels need triton>={need}"
    try:
        kernels()
    except Exception as exc:  # an old or broken triton fails in many ways, all "cannot run here"
        return f"triton {version} cannot load the kernels here: {first_line(exc)}"
    return None


def device_problem(device: torch.device) -> str | None:
    """None if the kernels can run on `device` here, else why not, as one line."""
    problem = triton_import_problem()
    if problem is not None:
        return problem
    if device.type == "cpu" and not interpreting():
        return "triton runs on CPU tensors only under TRITON_INTERPRET=1 (for testing)"
    if device.type not in ("cpu", "cuda"):
        return f"triton kernels need a CUDA device, not {device.type}"
    if device.type == "cuda" and not cuda_ops().is_available():
        return "CUDA is not available"
    return kernels_problem(interpreting())
