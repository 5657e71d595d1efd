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

from advisor.device.environment import cache_dir
from advisor.errors import StorageError, first_line
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.search.ledger import RECORD_FORMAT
from advisor.search.sqlite_claim import local_lock

HEARTBEAT_S = 2  # a worker's trial is alive while it beats this often...
GRACE_S = 8  # ...and is failed once silent this long; the search then enqueues it again
RETRIES = 2  # a point whose process died is retried this many times, then recorded as failed
_CREATE_TRIES = 5


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
    key = (os.getpid(), url, _file_id(url))
    if key in _OPENED:
        return _OPENED[key]
    for attempt in range(_CREATE_TRIES):
        try:
            storage = _rdb(url)
            _OPENED[(os.getpid(), url, _file_id(url))] = storage  # the file exists now
            return storage
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


# Database storages this process opened, by process, URL and (SQLite) file: opening one checks
# and creates optuna's schema (a noticeable fraction of a second), and a run opens its storage
# in several stages. A forked child opens its own (an engine does not cross a fork); a SQLite file that was
# removed or replaced since is opened anew.
_OPENED: dict[tuple[int, str, tuple[int, int] | None], RDBStorage] = {}


def _file_id(url: str) -> tuple[int, int] | None:
    """A SQLite file's identity (device, inode); None for a server database or a missing file."""
    if not url.startswith("sqlite:///"):
        return None
    try:
        st = Path(url.removeprefix("sqlite:///")).expanduser().stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


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
    """Two processes creating optuna's tables at once: PostgreSQL's and SQLite's wordings."""
    text = str(e)
    return any(
        s in text
        for s in (
            "UniqueViolation",
            "already exists",
            "duplicate key",
            "UNIQUE constraint failed",
            "database is locked",
        )
    )


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


# The shared layer measurements' study; its name carries the record's format, so measurements
# stored by an earlier format are never read as this one's.
SHARED_LAYERS = f"advisor-layers-{RECORD_FORMAT}"


def measured_under(settings: Settings) -> str:
    """The global settings a layer was measured under (its own implementation aside)."""
    return settings.global_only().model_dump_json()


class LayerStore:
    """Per-layer measurements, kept so they are not repeated.

    Two studies in the same storage: the run's companion "<study>/layers" (every layer
    measurement of this study, read by reports), and "`SHARED_LAYERS`@<fingerprint>", shared
    by every study on this machine and library versions: a layer group (signature, input shape, dtype, layout, gradient) measured
    with an implementation under the same global settings, mode, timing and gate settings in any
    earlier study is reused instead of measured again (what cuDNN's benchmark cache does within a
    process, kept across runs).
    """

    def __init__(
        self,
        storage: optuna.storages.BaseStorage,
        study_name: str,
        context: str = "",
        steps: int | None = None,
    ) -> None:
        self.steps = steps  # the run's horizon: a payback stop for another is measured again
        self.study = optuna.create_study(
            storage=storage, study_name=f"{study_name}/layers", load_if_exists=True
        )
        fingerprint = study_name.rpartition("@")[2]
        self.context = context  # mode and the space's timing and gate settings
        self.shared = (
            optuna.create_study(
                storage=storage, study_name=f"{SHARED_LAYERS}@{fingerprint}", load_if_exists=True
            )
            if context and "@" in study_name
            else None
        )

    def layer_results(
        self,
    ) -> tuple[dict[tuple[str, str, str], TrialResult], set[tuple[str, str, str]]]:
        """Stored layer measurements by (group, implementation, global settings they ran under),
        and which of them come from other studies. A resume under other global settings (another
        memory format or precision) measures again."""
        out: dict[tuple[str, str, str], TrialResult] = {}
        elsewhere = set()
        sources = [(self.study, False)] + ([(self.shared, True)] if self.shared else [])
        for study, shared in sources:
            for t in study.get_trials(deepcopy=False):
                a = t.user_attrs
                if "result" not in a or "key" not in a:
                    continue
                if shared and a.get("context") != self.context:
                    continue
                if (result := self._held(a)) is None:
                    continue
                key = (a["key"], a["impl"], measured_under(result.settings))
                if key not in out:
                    out[key] = result
                    if shared:
                        elsewhere.add(key)
        return out, elsewhere

    def first_result(self, key: str, impl: str, settings: Settings) -> TrialResult | None:
        """The first stored measurement of this layer group and implementation in this study:
        when two runs measured it at once, both then use the same one and agree."""
        under = measured_under(settings)
        for t in sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number):
            a = t.user_attrs
            if a.get("key") == key and a.get("impl") == impl and "result" in a:
                result = self._held(a)
                if result is not None and measured_under(result.settings) == under:
                    return result
        return None

    def _held(self, attrs: dict[str, Any]) -> TrialResult | None:
        """A trial's stored result, unless it is a payback stop for another horizon."""
        result = TrialResult.model_validate(attrs["result"])
        return None if result.stop is not None and not result.stop.holds_at(self.steps) else result

    def add_layer_result(self, result: TrialResult, *, shared: bool = True, **attrs: Any) -> None:
        self._add(self.study, result, attrs)
        if shared and self.shared is not None and result.status != "failed":
            # A failure may be this run's (a timeout, a crash): not worth keeping for others.
            self._add(self.shared, result, {**attrs, "context": self.context})

    @staticmethod
    def _add(study: optuna.Study, result: TrialResult, attrs: dict[str, Any]) -> None:
        ok = result.status == "ok"
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.COMPLETE if ok else TrialState.FAIL,
                value=result.median_ms if ok else None,
                params={},
                distributions={},
                user_attrs={**attrs, "result": result.model_dump(mode="json")},
            )
        )


class Claims:
    """Who measures what the runs sharing a study measure once (the finalists' re-time, the
    final check): two `advisor advise` runs of one study (started together, or one resuming)
    would each measure it and could decide differently from their own noise. The first to claim
    a key measures, and the measurement goes to the study's ledger (`search.ledger`), where the
    others read it. (`Study.user_attrs` reads the storage each time: what another process wrote
    is seen.)"""

    def __init__(self, study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
        self.study = study
        self._storage = storage  # as opened: optuna's study wraps an RDB one

    def _holder(self, key: str) -> Any:
        return self.study.user_attrs.get(f"claim:{key}")

    def claim(self, key: str, owner: str, land_s: float = 0.5) -> bool:
        """True when this process should measure, False when another process does. Where
        every process that shares the storage is on this host, the claim is read and written
        under a lock (the first claim wins). Elsewhere (a database server) it is held once
        concurrent claims have landed: the last writer holds it, after `land_s`."""
        lock = local_lock(self._storage)  # a fresh one each time: a lock is entered once
        if lock is not None:
            with lock:
                if self._holder(key) is None:
                    self.study.set_user_attr(f"claim:{key}", owner)
                    return True
            return bool(self._holder(key) == owner)
        if self._holder(key) is None:
            self.study.set_user_attr(f"claim:{key}", owner)
            time.sleep(land_s)
        return bool(self._holder(key) == owner)
