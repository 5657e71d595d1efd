"""Precision verdicts shared by every study of one workload on this machine.

A reduced precision is judged by training (advisor.gate.precision): seconds of training runs, once
per precision per model. A study keeps its verdicts (`Ledger.checks`), but another study of the
same model would not see them: `--effort quick` and then the default effort, or the same model
under another space, would train the same check again.

A verdict depends on the workload, the mode, the device, the space's `precision_check` settings
and the precision's own path (`PrecisionCheck.own_path`), and on the machine and library
versions; not on the effort, the timing, the tolerances or which knobs are searched. So it is
kept under a key of those in the study "advisor-precision-<record format>@<fingerprint>" of the
run's storage, beside `LayerStore`'s shared layer measurements. Nothing is shared through
`--storage memory` (a new store each run); `--fresh` judges again, and keeps the new verdict.

A verdict read back here is marked `reused`: the run did not spend its seconds (the stage
breakdown leaves them out) and the advice says where it came from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import optuna
import torch

from advisor.measure.verdict import PrecisionCheck
from advisor.search.ledger import RECORD_FORMAT
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["SharedChecks", "reused"]

# Its name carries the record's format, as the shared layer study's does: verdicts stored in an
# earlier format are never read as this one's
STUDY_PREFIX = f"advisor-precision-{RECORD_FORMAT}@"


class SharedChecks:
    """The verdicts other studies of this workload stored, and a place to add this run's."""

    def __init__(
        self,
        storage: optuna.storages.BaseStorage,
        study_name: str,
        workload: Workload,
        mode: str,
        device: torch.device,
        space: SearchSpace,
    ) -> None:
        fingerprint = study_name.rpartition("@")[2]
        self.study = (
            optuna.create_study(
                storage=storage, study_name=STUDY_PREFIX + fingerprint, load_if_exists=True
            )
            if "@" in study_name
            else None  # a study named without its environment: nothing to share it with
        )
        key = {
            "workload": workload.info.model_dump(mode="json"),
            "mode": mode,
            "device": str(device),
            "precision_check": space.precision_check.model_dump(mode="json"),
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
        self.prefix = f"{digest.hexdigest()[:20]}:"

    def read(self) -> list[PrecisionCheck]:
        """This workload's verdicts from earlier studies, marked `reused`."""
        if self.study is None:
            return []
        return reused(
            PrecisionCheck.model_validate(value)
            for key, value in self.study.user_attrs.items()
            if key.startswith(self.prefix)
        )

    def add(self, check: PrecisionCheck) -> None:
        """Keep a verdict this run measured (one read back from here is not written again)."""
        if self.study is None or check.reused:
            return
        self.study.set_user_attr(self.prefix + check.own_path.label(), check.model_dump(mode="json"))


def reused(checks: Iterable[PrecisionCheck]) -> list[PrecisionCheck]:
    """`checks` marked as judged before this run (its seconds were not this run's)."""
    return [c if c.reused else c.model_copy(update={"reused": True}) for c in checks]
