"""On PostgreSQL, a grid point is measured by one process at a time: a session advisory lock per
(study, point), held from the duplicate check until the result is stored.

The duplicate check alone (a lower-numbered trial of the point has a result, or is waiting or
running) reads what other processes have committed. Two trials of one point, enqueued by two
workers at the same instant, can each pass it when the lower one's row commits after the higher
one looked, or when optuna's trial cache has not fetched it; both would then be measured. With
the lock, the second process finds the point
held (another process measures it) or, once it holds it, the first one's stored result, read
from the database directly.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import optuna

__all__ = ["PointLocks"]


class PointLocks:
    """Advisory locks on one PostgreSQL storage's study points; a no-op elsewhere (`active`)."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str) -> None:
        engine = getattr(storage, "engine", None)
        postgres = engine is not None and engine.dialect.name == "postgresql"
        self._engine: Any = engine if postgres else None
        self._conn: Any = None
        self._study = study_name

    @property
    def active(self) -> bool:
        return self._engine is not None

    def _key(self, point: str) -> int:
        digest = hashlib.sha256(f"{self._study}\0{point}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)  # PostgreSQL's bigint

    def _connection(self) -> Any:
        if self._conn is None:
            # Session locks live as long as this connection; autocommit, so no transaction (and
            # no snapshot) stays open while a candidate is measured.
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self._conn

    def hold(self, point: str) -> bool:
        """Take the point's lock without waiting: True when this process now holds it (always
        True where locks are not used), False when another process does."""
        if not self.active:
            return True
        from sqlalchemy import text

        got = self._connection().execute(
            text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key(point)}
        )
        return bool(got.scalar())

    def release(self, point: str) -> None:
        if not self.active or self._conn is None:
            return
        from sqlalchemy import text

        with contextlib.suppress(Exception):  # a lost connection has released it already
            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key(point)})

    def close(self) -> None:
        """Release every lock held here. (The connection goes back to SQLAlchemy's pool, which
        keeps it open: session locks would outlive this object. A process that dies loses its
        connection, and the server releases its locks.)"""
        if self._conn is not None:
            from sqlalchemy import text

            with contextlib.suppress(Exception):
                self._conn.execute(text("SELECT pg_advisory_unlock_all()"))
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
