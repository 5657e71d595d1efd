"""On SQLite, a popped trial belongs to exactly one process: the claim is made under a file lock.

SQLite has no row locks (optuna's `SELECT ... FOR UPDATE` is a no-op there), so two processes can
pop the same waiting trial. Each then names itself its owner; without a lock the check "am I the
owner?" reads back what the process just wrote (optuna's `Trial.user_attrs` is its local copy), so
both would measure the trial and the second to finish would fail on telling a finished trial.
Here the owner is read from the database and written under an
exclusive `flock` on a file beside the database: the first claim wins, the second sees it.
(SQLite databases are local files, so every process that shares one is on this host.)
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

import optuna

__all__ = ["TrialClaims", "local_lock"]


@contextlib.contextmanager
def _lock_beside(path: Path) -> Iterator[None]:
    """An exclusive lock on a file beside `path` (`<name>.claims.lock`)."""
    with open(path.expanduser().resolve().with_name(path.name + ".claims.lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def local_lock(
    storage: optuna.storages.BaseStorage,
) -> contextlib.AbstractContextManager[None] | None:
    """A lock that every process sharing `storage` takes, for a read-then-write claim: none
    needed where only this process sees it (in memory), a file lock beside a SQLite database or
    a journal file (local files: every process sharing one is on this host), and None for a
    database server, whose processes may run on several hosts."""
    if isinstance(storage, optuna.storages.InMemoryStorage):
        return contextlib.nullcontext()
    engine = getattr(storage, "engine", None)
    if engine is not None:
        if engine.dialect.name != "sqlite":
            return None
        database = engine.url.database
        if not database or database == ":memory:":
            return contextlib.nullcontext()
        return _lock_beside(Path(database))
    backend = getattr(storage, "_backend", None)
    path = getattr(backend, "_file_path", None)
    return _lock_beside(Path(path)) if isinstance(path, str) else None


class TrialClaims:
    """Exclusive claims of trials of one SQLite-stored study by one owner, under the lock every
    process sharing the database takes (`local_lock`)."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_id: int, owner: str) -> None:
        self._storage, self._study_id, self._owner = storage, study_id, owner

    def claim(self, trial: optuna.Trial) -> bool:
        """Name this owner the trial's owner unless another process did first: True when it is
        this process's trial now."""
        storage = self._storage
        trial_id = storage.get_trial_id_from_study_id_trial_number(self._study_id, trial.number)
        lock = local_lock(storage)
        assert lock is not None, "trial claims are for a SQLite database"
        with lock:
            # An unfinished trial is read from the database, not from optuna's cache.
            owner = storage.get_trial(trial_id).user_attrs.get("worker")
            if owner not in (None, self._owner):
                return False
            trial.set_user_attr("worker", self._owner)
        return True
