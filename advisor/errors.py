"""Errors the advisor raises on bad input. The CLI prints each as one line and exits with code 2."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


def validation_message(e: ValidationError, what: str) -> str:
    """A pydantic error as one line naming the first invalid field."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    return f"invalid {what}: {loc}: {msg}" if loc else f"invalid {what}: {msg}"


def first_line(e: BaseException, limit: int = 300, *, with_type: bool = True) -> str:
    """An exception as one line: its type (unless `with_type` is off) and the first line of its
    text (its type alone when it has none)."""
    first = (str(e).strip().splitlines() or [""])[0][:limit]
    if not first:
        return type(e).__name__
    return f"{type(e).__name__}: {first}" if with_type else first


class AdvisorError(Exception):
    """Base class: a problem the user can fix, reported as one line."""


def check_file(path: Path, what: str, error: type[AdvisorError]) -> None:
    """Raise `error` unless `path` is a file: "{what} not found", or a folder's own line."""
    if not path.is_file():
        raise error(f"{what} {path} is a folder" if path.is_dir() else f"{what} not found: {path}")


class SpecError(AdvisorError):
    """A layer spec or input shape that does not describe a valid layer."""


class ModelFileError(AdvisorError):
    """A model file that is missing, does not import, or whose factories fail."""


class SpaceError(AdvisorError):
    """A search-space file that is missing or invalid."""


class ConfigError(AdvisorError):
    """A config file that is missing, corrupt, or not an advisor config."""


class DeviceError(AdvisorError):
    """A device that does not exist or is not available here."""


class ImplError(AdvisorError):
    """An unknown convolution implementation, or one that cannot run a layer."""


class StorageError(AdvisorError):
    """A study storage that cannot be opened or is corrupt."""


class OutputError(AdvisorError, OSError):
    """An output file (config, trials CSV) that cannot be written; the message names it.

    Also an OSError, so code that catches a failed write's OSError still catches it."""
