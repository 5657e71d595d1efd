"""A conv layer as written in PyTorch, `Conv2d(3, 16, 3, padding=1)`, read with `ast` (never
evaluated) into its constructor's arguments by name; any text gives those or a one-line SpecError.
"""

from __future__ import annotations

import ast
from typing import Any, Literal

from advisor.errors import SpecError
from advisor.workload.sizes import short

__all__ = ["KINDS", "MAX_SPEC_CHARS", "ConvKind", "parse_layer_call"]

ConvKind = Literal[
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"
]
KINDS: dict[str, str] = {k.lower(): k for k in ConvKind.__args__}  # type: ignore[attr-defined]
# PyTorch's positional order, which differs between plain and transposed convs.
_POSITIONAL = ("in_channels", "out_channels", "kernel_size", "stride", "padding")
_POSITIONAL_T = (*_POSITIONAL, "output_padding", "groups", "bias", "dilation")
_POSITIONAL_C = (*_POSITIONAL, "dilation", "groups", "bias")

MAX_SPEC_CHARS = 10_000  # a layer is written in well under 200; more is not a layer


def _source(text: str, node: ast.AST, limit: int = 60) -> str:
    """The text of `node` (shortened), without `ast.unparse` (which recurses on deep trees)."""
    try:
        segment = ast.get_source_segment(text, node)
    except (RecursionError, MemoryError, ValueError):
        segment = None
    return short(segment if segment is not None else type(node).__name__, limit)


def parse_layer_call(text: str) -> dict[str, Any]:
    """'Conv2d(3, 16, 3, padding=1)' -> {'kind': 'Conv2d', 'in_channels': 3, ...}, without eval.

    Any text gives this or a one-line SpecError: no parser error, however deep or long the text,
    escapes as a traceback."""
    text = text.strip()
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(
            f"layer spec is {len(text)} characters long (at most {MAX_SPEC_CHARS}); "
            "expected e.g. 'Conv2d(64, 64, 3, padding=1)'"
        )
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        deep = " (too deeply nested)" if isinstance(e, (RecursionError, MemoryError)) else ""
        raise SpecError(
            f"cannot parse layer {short(repr(text))}{deep}: "
            "expected e.g. 'Conv2d(64, 64, 3, padding=1)'"
        ) from None
    if not isinstance(node, ast.Call):
        raise SpecError(f"layer {short(repr(text))} is not a call like 'Conv2d(64, 64, 3)'")
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name is None or name.lower() not in KINDS:
        raise SpecError(
            f"unknown layer {_source(text, func)!r}; expected one of {', '.join(KINDS.values())}"
        )
    kind = KINDS[name.lower()]
    names = _POSITIONAL_T if kind.startswith("ConvTranspose") else _POSITIONAL_C
    if len(node.args) > len(names):
        raise SpecError(
            f"{kind} takes at most {len(names)} positional arguments, got {len(node.args)}"
        )
    out: dict[str, Any] = {"kind": kind}
    items = list(zip(names, node.args, strict=False)) + [(kw.arg, kw.value) for kw in node.keywords]
    for key, value in items:
        if key is None:
            raise SpecError("**kwargs are not allowed in a layer spec")
        if key in ("device", "dtype") and key not in out:
            if key == "dtype":
                out["dtype"] = _source(text, value).removeprefix("torch.")
                continue
            raise SpecError("device belongs to --device, not the layer spec")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise SpecError(f"argument {key}={_source(text, value)} is not a literal") from None
        if isinstance(out[key], list):
            out[key] = tuple(out[key])
    return out
