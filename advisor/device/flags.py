"""PyTorch's fp32 precision flags (TF32 for cuDNN convs and CUDA matmuls): read, written so that
every reader still works, and put back exactly.

PyTorch has two APIs for them. The legacy one (`torch.backends.cudnn.allow_tf32`,
`torch.backends.cuda.matmul.allow_tf32`, `torch.set_float32_matmul_precision`) writes the new
per-backend values too; the new one (`torch.backends.*.fp32_precision`, torch 2.9 and later) does
not write the legacy values, and the legacy getters then raise ("mix of the legacy and new APIs",
pytorch/pytorch#166387). Inductor's max-autotune, Dynamo and Lightning's Trainer call those
getters, so a flag written through the new API alone would break a user's `torch.compile` after
`advisor.apply`. So:

- a candidate's flags are written through the legacy setters, which keep both views in step (and
  exist on every torch this project supports, where the new API's values differ between releases:
  torch 2.7/2.8 accept only "default"/"tf32" for CUDA);
- a saved state is put back exactly: the legacy value where it could be read, then every new-API
  value as it was read (parents before children: writing a parent resets its children).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = [
    "conv_tf32",
    "has_mkldnn_conv_precision",
    "onednn_convs",
    "cudnn_benchmark",
    "read_flags",
    "matmul_tf32",
    "read_raw",
    "restore_raw",
    "write_mkldnn_conv",
    "write_flags",
    "write_tf32",
]

# The new API's objects that hold a value, parents before children.
_NODES = (
    ("generic", lambda: torch.backends),
    ("cuda", lambda: torch.backends.cuda),
    ("cudnn", lambda: torch.backends.cudnn),
    ("mkldnn", lambda: torch.backends.mkldnn),
    ("cuda.matmul", lambda: torch.backends.cuda.matmul),
    ("cudnn.conv", lambda: getattr(torch.backends.cudnn, "conv", None)),
    ("cudnn.rnn", lambda: getattr(torch.backends.cudnn, "rnn", None)),
    ("mkldnn.matmul", lambda: getattr(torch.backends.mkldnn, "matmul", None)),
    ("mkldnn.conv", lambda: getattr(torch.backends.mkldnn, "conv", None)),
    ("mkldnn.rnn", lambda: getattr(torch.backends.mkldnn, "rnn", None)),
)
_PARENT = {"cuda.matmul": "cuda", "cudnn.conv": "cudnn", "cudnn.rnn": "cudnn"}
_PARENT |= {"mkldnn.matmul": "mkldnn", "mkldnn.conv": "mkldnn", "mkldnn.rnn": "mkldnn"}
_PARENT |= {"cuda": "generic", "cudnn": "generic", "mkldnn": "generic"}


def _node(name: str) -> Any:
    return dict(_NODES)[name]()


def _new_values() -> dict[str, str]:
    """Every new-API value this torch has (empty on a torch without it)."""
    out = {}
    for name, get in _NODES:
        obj = get()
        value = getattr(obj, "fp32_precision", None) if obj is not None else None
        if isinstance(value, str):
            out[name] = value
    return out


def _effective(values: dict[str, str], name: str) -> str:
    """A node's precision in force: its own value, or its parent's where it has none."""
    while values.get(name, "none") == "none" and name in _PARENT:
        name = _PARENT[name]
    return values.get(name, "none")


def _legacy(read: Any) -> Any:
    """A legacy getter's value, or None where it raises (the two APIs were mixed)."""
    try:
        return read()
    except RuntimeError:
        return None


def read_raw() -> dict[str, Any]:
    """Everything `restore_raw` needs to put the flags back exactly, as plain values."""
    return {
        "legacy_matmul": _legacy(torch.get_float32_matmul_precision),
        "legacy_cudnn": _legacy(lambda: torch.backends.cudnn.allow_tf32),
        "new": _new_values(),
    }


def conv_tf32() -> bool:
    """Whether cuDNN convs may use TF32 now (read without a legacy getter: never raises)."""
    values = _new_values()
    if "cudnn.conv" in values:
        return _effective(values, "cudnn.conv") == "tf32"
    return bool(torch.backends.cudnn.allow_tf32)


def matmul_tf32() -> bool:
    """Whether fp32 CUDA matmuls may use TF32 now (Triton's tl.dot follows it too). Reflects
    `torch.set_float32_matmul_precision`: "high" and "medium" allow it, "highest" does not."""
    values = _new_values()
    if "cuda.matmul" in values:
        return _effective(values, "cuda.matmul") == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


def _legacy_readable() -> bool:
    try:
        torch.get_float32_matmul_precision()
        _ = torch.backends.cuda.matmul.allow_tf32
        _ = torch.backends.cudnn.allow_tf32
    except RuntimeError:
        return False
    return True


def write_tf32(conv: bool, matmul: bool) -> None:
    """TF32 for cuDNN convs and CUDA matmuls, through the legacy setters (both views in step).

    A user's "medium" (which allows TF32 on CUDA and bf16 in oneDNN's CPU matmuls) is kept when
    TF32 matmuls are wanted. Where IEEE CUDA matmuls are wanted beside a reduced-precision
    oneDNN matmul, no legacy value describes the mix and the legacy getters would raise: the
    matmul precision becomes "highest" everywhere, which every reader can read."""
    torch.backends.cudnn.allow_tf32 = conv  # sets the conv and rnn values of the new API too
    if not (matmul and _legacy(torch.get_float32_matmul_precision) == "medium"):
        torch.backends.cuda.matmul.allow_tf32 = matmul
    if not _legacy_readable():
        torch.set_float32_matmul_precision("high" if matmul else "highest")


def restore_raw(saved: dict[str, Any]) -> None:
    """Put back what `read_raw` saved: the legacy values where they were readable, then every
    new-API value exactly (parents first: a parent's write resets its children)."""
    if read_raw() == saved:
        return
    new = saved["new"]
    # A legacy value the user's mix of APIs hid is not known: the one their new values imply.
    legacy_matmul = saved["legacy_matmul"] or _implied_matmul_precision(new)
    torch.set_float32_matmul_precision(legacy_matmul)
    if saved["legacy_cudnn"] is not None:
        torch.backends.cudnn.allow_tf32 = saved["legacy_cudnn"]
    elif "cudnn.conv" in new:
        torch.backends.cudnn.allow_tf32 = _effective(new, "cudnn.conv") == "tf32"
    for name, value in new.items():
        obj = _node(name)
        if obj is not None and getattr(obj, "fp32_precision", None) != value:
            with contextlib.suppress(RuntimeError, ValueError):  # one this torch rejects: leave it
                obj.fp32_precision = value


def _implied_matmul_precision(values: dict[str, str]) -> str:
    """The legacy matmul precision that agrees with these new-API values."""
    if _effective(values, "mkldnn.matmul") == "bf16":
        return "medium"
    if "tf32" in (_effective(values, "cuda.matmul"), _effective(values, "mkldnn.matmul")):
        return "high"
    return "highest"


def has_mkldnn_conv_precision() -> bool:
    """Whether this torch lets oneDNN compute fp32 convs in bf16 (`mkldnn.conv.fp32_precision`)."""
    return "mkldnn.conv" in _new_values()


def onednn_convs() -> bool:
    """Whether CPU convs run on oneDNN here (built with it, and not turned off)."""
    return torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)


def write_mkldnn_conv(value: str) -> None:
    """oneDNN's fp32 conv precision: "bf16" (bf16 products, fp32 sums) or "ieee". The legacy
    getters do not read it (they check CUDA and oneDNN *matmul* values), so the new API is the
    only one there is."""
    node = _node("mkldnn.conv")
    if node is not None and node.fp32_precision != value:
        node.fp32_precision = value


def read_flags() -> dict[str, Any]:
    """The flags the advisor sets, now: a summary (whether convs and matmuls may use TF32) and
    what it takes to restore them exactly."""
    return {
        "tf32": {"conv": conv_tf32(), "matmul": matmul_tf32()},
        "tf32_raw": read_raw(),
        "cudnn_benchmark": cudnn_benchmark(),
    }


def write_flags(state: dict[str, Any]) -> None:
    """Set the flags to a state `read_flags()` returned (restored exactly) or one made of a
    summary (`tf32`: None leaves TF32 as it is), `cudnn_benchmark` and optionally
    `mkldnn_conv`."""
    if "tf32_raw" in state:
        restore_raw(state["tf32_raw"])
    elif state["tf32"] is not None:
        write_tf32(state["tf32"]["conv"], state["tf32"]["matmul"])
    if "mkldnn_conv" in state:
        write_mkldnn_conv(state["mkldnn_conv"])
    torch.backends.cudnn.benchmark = state["cudnn_benchmark"]


def cudnn_benchmark() -> bool:
    """Whether cuDNN times its algorithms per shape now (torch.backends.cudnn.benchmark)."""
    return bool(torch.backends.cudnn.benchmark)
