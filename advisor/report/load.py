"""What a report shows, loaded from its source into a `ReportData` before anything is drawn.

The source is a config file or a study name. A config's study is looked up in the storage; when
it is gone, the trials CSV beside the config stands in, and failing that the config's own result.
A study is read with its companion "<study>/layers" (per-layer measurements), both from the one
storage opened here.

The summary (baseline vs recommendation) is a config's `result`: the file's own, or for a study
the one `advise` would write from it as it stands. `advisor.report.layer_rows` makes the per-layer
rows and the optional roofline column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.config import Config, load_config
from advisor.errors import AdvisorError, ConfigError, StorageError, first_line, validation_message
from advisor.report.layer_rows import layer_rows as read_layer_rows

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from advisor.search.ledger import Ledger

REQUIRED_CSV_COLUMNS = ("label", "status", "median_ms", "ci_low_ms", "ci_high_ms")


@dataclass
class ReportData:
    title: str
    mode: str
    source: str
    environment: dict[str, Any]
    trials: pd.DataFrame
    config: Config | None  # the config file, or the one the study implies (`_config_of_study`)
    study: optuna.Study | None = None
    layer_rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StoredStudy:
    """A study and its companion "<name>/layers" (None if the search made none), one storage."""

    study: optuna.Study
    layers: optuna.Study | None


def load_report_data(source: str, storage: str | None = None) -> ReportData:
    """A config file (with its study, or its trials CSV) or a study name in `storage`."""
    path = Path(source)
    if path.suffix == ".json" or path.is_file():
        return _from_config(path, storage)
    stored = _open_study(source, storage)
    if stored is None:
        raise StorageError(
            f"no config file or study named {source!r} (storage: {storage or 'the default cache'})"
        )
    return _from_study(stored)


def _from_config(path: Path, storage: str | None) -> ReportData:
    cfg = load_config(path)
    env = cfg.environment.model_dump(mode="json")
    title = str(cfg.workload.get("description") or cfg.workload.get("target") or path.name)
    notes: list[str] = []
    study_name = cfg.workload.get("study")
    stored = None
    if isinstance(study_name, str):
        try:
            stored = _open_study(study_name, storage)
        except StorageError as e:
            notes.append(f"study not read ({e}): built from the config and its trials table")
    csv = path.with_name(path.stem + ".trials.csv")
    layer_rows: list[dict[str, Any]] = []
    if stored is not None:
        trials = _trials_from_study(stored)[0]
        layer_rows = read_layer_rows(stored.layers, cfg.mode, env)
        notes.append(f"trials from study {stored.study.study_name!r}")
    elif csv.is_file():
        trials = _trials_from_csv(csv)
        notes.append(f"study not found in the storage: trials from {csv.name}")
    elif cfg.result is not None:
        trials = _trials_from_result(cfg)
        notes.append("neither the study nor the trials table found: only the config's result")
    else:
        raise ConfigError(f"{path} has no result, and neither its study nor {csv.name} exists")
    study = stored.study if stored is not None else None
    return ReportData(title, cfg.mode, str(path), env, trials, cfg, study, layer_rows, notes)


def _from_study(stored: StoredStudy) -> ReportData:
    study = stored.study
    attrs = study.user_attrs
    workload = attrs.get("workload") or {}
    trials, ledger = _trials_from_study(stored)
    env = attrs.get("environment") or {}
    mode = str(attrs.get("mode", "?"))
    data = ReportData(
        title=str(workload.get("description") or workload.get("target") or study.study_name),
        mode=mode,
        source=f"study {study.study_name!r}",
        environment=env,
        trials=trials,
        config=_config_of_study(study, ledger),
        study=study,
    )
    data.layer_rows = read_layer_rows(stored.layers, mode, env)
    if data.config is None:
        data.notes.append("PyTorch's default has no valid measurement: no speedup to report")
    return data


# ---------------------------------------------------------------- the storage


def _sqlite_missing(url: str) -> bool:
    """Opening a SQLite URL creates the file: a report must not, so check first."""
    if not url.startswith("sqlite:///"):
        return False
    return not Path(url.removeprefix("sqlite:///")).expanduser().is_file()


def _open_study(name: str, storage_url: str | None) -> StoredStudy | None:
    """The stored study called `name` (or `name@<fingerprint>` when only one matches) with its
    companion; None if the storage has no such study. A storage that cannot be opened, or a
    study stored in another record format (`check_format`), is a StorageError."""
    import optuna

    from advisor.search.ledger import check_format
    from advisor.search.storage import default_storage_url, open_storage

    url = storage_url or default_storage_url()
    if url == "memory":
        raise StorageError("--storage memory holds no studies between runs: name a stored one")
    if _sqlite_missing(url) or ("://" not in url and not Path(url).is_file()):
        return None
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(url)
    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except Exception as e:  # noqa: BLE001 - backends raise many kinds on a corrupt store
        raise StorageError(
            f"cannot read studies from {url}: {first_line(e, with_type=False)}"
        ) from None
    if name not in names:
        matches = [n for n in names if n.startswith(f"{name}@") and not n.endswith("/layers")]
        if len(matches) != 1:
            return None
        name = matches[0]
    study = optuna.load_study(study_name=name, storage=storage)
    check_format(study, name)
    layers = None
    if f"{name}/layers" in names:  # the search made per-layer measurements
        layers = optuna.load_study(study_name=f"{name}/layers", storage=storage)
    return StoredStudy(study, layers)


# ---------------------------------------------------------------- trials and summary


def _trials_from_study(stored: StoredStudy) -> tuple[pd.DataFrame, Ledger]:
    """The trials table, every measured candidate's standing from the study's ledger
    (`advisor.search.ledger`: the search's trials by number, then the later stages', numbered
    -1), each against PyTorch's default where it was measured (the search enqueues it first),
    else the first; and the ledger."""
    import pandas as pd

    from advisor.advice import trial_row
    from advisor.knobs import Settings
    from advisor.search.ledger import Ledger

    ledger = Ledger(stored.study, Settings())
    results = ledger.results()
    if not results:
        raise StorageError(f"study {stored.study.study_name!r} has no measured trials yet")
    base = ledger.baseline() or results[0]
    rows = [trial_row(o, r, base) for o, r in zip(ledger.origins(), results, strict=True)]
    return pd.DataFrame(rows), ledger


def _config_of_study(study: optuna.Study, ledger: Ledger) -> Config | None:
    """The config `advise` would write from the study as it stands (`advice.build_advice` on
    its ledger, under the space's `min_gain`); None where PyTorch's default has no valid
    measurement. A study without the attributes the search stores is a StorageError."""
    from pydantic import ValidationError

    from advisor.advice import build_advice
    from advisor.device.environment import Environment
    from advisor.measure.contest import Contest
    from advisor.search.options import SearchOutcome
    from advisor.workload.info import parse_info

    base = ledger.baseline()
    if base is None or base.status != "ok" or base.measurement is None:
        return None
    attrs = study.user_attrs
    try:
        env = Environment.model_validate(attrs["environment"])
        info, mode, space = parse_info(attrs["workload"]), attrs["mode"], attrs["space"]
        contest = Contest(min_gain=float(attrs["min_gain"]))
    except (KeyError, TypeError, ValueError, AdvisorError) as e:  # ValidationError: a ValueError
        what = first_line(e, with_type=False)
        if isinstance(e, KeyError):
            what = f"no {e}"
        elif isinstance(e, ValidationError):  # the environment's (the info's is a ConfigError)
            what = validation_message(e, "environment")
        raise StorageError(
            f"study {study.study_name!r} does not hold what advise stores with a study ({what})"
        ) from None
    outcome = SearchOutcome(study_name=study.study_name, environment=env, ledger=ledger)
    return build_advice(outcome, info, mode, space, contest=contest).config


def _trials_from_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=["", "nan", "NaN"])
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ConfigError(
            f"cannot read trials table {path}: {first_line(e, with_type=False)}"
        ) from None
    missing = [c for c in REQUIRED_CSV_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"trials table {path} lacks column(s): {', '.join(missing)}")
    for col in ("reason", "layers"):
        if col in df.columns:
            df[col] = ["" if pd.isna(v) else str(v) for v in df[col]]
    return df


def _trials_from_result(cfg: Config) -> pd.DataFrame:
    """Only the config survives: its two timings are all there is to plot."""
    import pandas as pd

    r = cfg.result
    assert r is not None
    labelled = (("default", r.baseline), (cfg.settings.label(), r.tuned))
    rows = [
        {"trial": i, "label": label, "status": "ok", "reason": "", **t.model_dump()}
        for i, (label, t) in enumerate(labelled)
    ]
    return pd.DataFrame(rows).drop_duplicates(subset="label")
