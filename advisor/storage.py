"""Where studies live: an embedded SQLite file by default, PostgreSQL (or another RDB) to scale out,
or an optuna journal file. Only imported by the search: training start never pays for optuna.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from advisor.errors import StorageError, first_line
from advisor.knobs import Settings
from advisor.results import TrialResult

HEARTBEAT_S = 2  # a worker's trial is alive while it beats this often...
GRACE_S = 8  # ...and is failed once silent this long; the search then enqueues it again
RETRIES = 2  # a point whose process died is retried this many times, then recorded as failed
_CREATE_TRIES = 5


def cache_dir() -> Path:
    """$ADVISOR_CACHE_DIR, else $XDG_CACHE_HOME/conv-advisor, else ~/.cache/conv-advisor."""
    if "ADVISOR_CACHE_DIR" in os.environ:
        return Path(os.environ["ADVISOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "conv-advisor"


def default_storage_url() -> str:
    return f"sqlite:///{cache_dir() / 'studies.db'}"


def _rdb_url(url: str) -> str:
    # SQLAlchemy's default PostgreSQL driver is psycopg2; we depend on psycopg (3).
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def open_storage(url: str | None) -> optuna.storages.BaseStorage:
    """'memory', a database URL (sqlite:///..., postgresql://...), or a journal file path.

    A file that cannot be read as a study storage is a StorageError (one line); it is never
    repaired, truncated or replaced, so nothing stored in it (or beside it) is lost.
    """
    if url == "memory":
        return optuna.storages.InMemoryStorage()
    url = url or default_storage_url()
    if "://" not in url:
        return _journal(Path(url).expanduser())
    if url.startswith("sqlite:///"):
        _make_parent(Path(url.removeprefix("sqlite:///")).expanduser(), url)
    for attempt in range(_CREATE_TRIES):
        try:
            return _rdb(url)
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/driver errors: report one line
            # Workers starting together on a fresh database race to create optuna's tables:
            # the losers see a unique-key violation; by the next try the tables exist.
            if attempt + 1 < _CREATE_TRIES and _creation_race(e):
                time.sleep(0.2 + random.random() * (attempt + 1))
                continue
            raise StorageError(
                f"cannot open storage {_redact(url)}: {first_line(e, 200, with_type=False)}"
            ) from None
    raise AssertionError("unreachable")


def _rdb(url: str) -> RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeats are marked experimental in optuna
        # Stale trials are failed by the heartbeat check; the search re-enqueues their points
        # itself (optuna's retry callback would copy the dead trial's attributes).
        return RDBStorage(
            _rdb_url(url),
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            engine_kwargs=_engine_kwargs(url),
        )


def _creation_race(e: BaseException) -> bool:
    text = str(e)
    return any(s in text for s in ("UniqueViolation", "already exists", "duplicate key"))


def _journal(path: Path) -> JournalStorage:
    if path.is_dir():
        raise StorageError(f"journal storage {path} is a directory")
    _make_parent(path, str(path))
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except Exception as e:  # noqa: BLE001 - optuna raises several kinds on a bad log
        raise StorageError(
            f"cannot open journal storage {path}: not an optuna journal ({first_line(e, 200, with_type=False)})"
        ) from None


def _make_parent(path: Path, what: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create the folder for {what}: {e.strerror or e}") from None


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    return {"pool_pre_ping": True}


def _redact(url: str) -> str:
    """Hide a password in a URL for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else url
    return url


def measured_under(settings: Settings) -> str:
    """The global settings a layer was measured under (its own implementation aside)."""
    return settings.global_only().model_dump_json()


class LayerStore:
    """The companion study "<study>/layers": per-layer measurements and the whole-model
    measurements of per-layer combinations, kept so a resumed search does not repeat them."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str) -> None:
        self.study = optuna.create_study(
            storage=storage, study_name=f"{study_name}/layers", load_if_exists=True
        )

    def layer_results(self) -> dict[tuple[str, str, str], TrialResult]:
        """Stored layer measurements by (group, implementation, global settings they ran under):
        a resume under other global settings (another memory format or precision) measures
        again."""
        out = {}
        for t in self.study.get_trials(deepcopy=False):
            if "result" in t.user_attrs and "key" in t.user_attrs:
                result = TrialResult.model_validate(t.user_attrs["result"])
                out[
                    (t.user_attrs["key"], t.user_attrs["impl"], measured_under(result.settings))
                ] = result
        return out

    def add_layer_result(self, result: TrialResult, **attrs: Any) -> None:
        self._add(result, attrs)

    def model_result(self, settings: Settings) -> TrialResult | None:
        """The whole-model measurement of a per-layer combination, if a previous run stored it."""
        key = settings.model_dump_json()
        for t in self.study.get_trials(deepcopy=False):
            if t.user_attrs.get("kind") == "model" and t.user_attrs.get("settings") == key:
                return TrialResult.model_validate(t.user_attrs["result"])
        return None

    def add_model_result(self, result: TrialResult) -> None:
        """Keep the combination's whole-model measurement (for resuming and for reports)."""
        attrs = {
            "kind": "model",
            "settings": result.settings.model_dump_json(),
            "label": result.settings.label(),
        }
        self._add(result, attrs)

    def _add(self, result: TrialResult, attrs: dict[str, Any]) -> None:
        ok = result.status == "ok"
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.COMPLETE if ok else TrialState.FAIL,
                value=result.median_ms if ok else None,
                params={},
                distributions={},
                user_attrs={**attrs, "result": result.model_dump(mode="json")},
            )
        )
