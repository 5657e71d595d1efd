"""Reuse: the same `advise` asked again, with the default storage, is answered from the advice the
first run stored, before anything is probed, loaded or measured.

A second run of the same question would reuse the stored study (its ledger and its layer
measurements) anyway, but would still pay for the isolated probe of the user's code, a worker's
start and the model's load: seconds that a stored answer does not need.

The key is a hash of everything the advice depends on:
- every argument of `run_advise` except the callbacks (`progress`, `on_eager`), `fresh` and
  `storage` (a new argument is keyed without a change here); `device`, `space` and
  `tolerances` by what they resolve to (below);
- for a model file or a layer file, its resolved path and its own bytes. Only the
  file's own content is compared: modules it imports (a local helper, torchvision) are not, so an
  edit there needs `--fresh`. A module target (`package.module:build`) and a live model object
  are never reused;
- the resolved search space's content (after `--tolerance` and the effort level), the device,
  every field of the environment (advisor.device.environment: the hardware, torch, CUDA,
  cuDNN, Triton, Python), the environment variables that steer torch and the advisor, and the
  advisor's version and own code.

Only a complete answer is stored: one the budget cut short (candidates or layers unmeasured) or
that kept the default because a re-time or the final check failed is not, so a rerun resumes
the study and measures what is missing. `fresh` drops the stored answer and tunes anew. An
entry that cannot be read back as it was written is ignored.

Entries are JSON (pydantic) in `cache_dir()/advice/<key>.json`, written atomically.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

import torch
from pydantic import BaseModel, ConfigDict

from advisor.advice import Advice
from advisor.config import Config, atomic_write
from advisor.device.environment import Environment, cache_dir, current_environment
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.search.ledger import Entry, Ledger
from advisor.search.options import SearchOutcome
from advisor.search.pick import Pick
from advisor.space import Dropped, SearchSpace
from advisor.stages.layer_groups import LayerGroup
from advisor.stages.per_layer import LayerChoice
from advisor.version import __version__
from advisor.workload.args import make_workload

__all__ = ["AdviceReuse", "reuse_key"]

log = logging.getLogger("advisor")

ENTRY_FORMAT: Final = 2
# Arguments that do not change the answer: callbacks, and what decides whether to reuse at all.
UNKEYED = frozenset({"progress", "on_eager", "fresh", "storage"})
# Arguments keyed by what they resolve to (the device, the space's content after the tolerances):
# `--device auto` and `cpu`, or no tolerances and `{}`, ask the same question.
RESOLVED = frozenset({"device", "space", "tolerances"})
# Environment variables that change what is measured or what the advisor tries (plugins).
ENV_PREFIXES = ("ADVISOR_", "TORCH", "PYTORCH_", "TRITON_", "CUDA_", "NVIDIA_", "OMP_", "MKL_",
                "KMP_", "DNNL_", "ONEDNN_")  # fmt: skip


class NotReusable(Exception):
    """This run's question has no key: it is answered afresh and nothing is stored."""


class StoredChoice(BaseModel):
    """A per-layer choice without its layer workload (the stage's tool, not the advice's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str
    names: tuple[str, ...]
    description: str
    kept: str | None
    recipe: bool
    results: dict[str, TrialResult]
    chosen: str
    why: str
    skipped: dict[str, str]


class StoredAdvice(BaseModel):
    """One run's `Advice`, as stored for reuse."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: Literal[2] = ENTRY_FORMAT
    key: str
    stored: str  # when the first run ended (UTC, ISO 8601)
    model_file: bool  # its note says that imported modules are not compared
    config: Config
    entries: list[Entry]  # the run's ledger: every standing is read from it again
    default: Settings
    run: str
    chosen: Settings
    fastest: Settings
    why: str
    path: list[str]
    multi: bool
    dropped: list[tuple[str, str]]
    study_name: str
    environment: Environment
    elapsed_s: float
    not_measured: list[str]
    screen_note: str | None
    layer_choices: list[StoredChoice]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _code_digest() -> str:
    """The advisor's own source (about 10 ms): a changed advisor measures and picks anew, even
    at the same version number (a development tree)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """`value` as JSON data, or NotReusable for anything else (a model, a tensor, a callable)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    raise NotReusable(f"a {type(value).__name__} argument")


def _file(target: Any) -> dict[str, str]:
    """A file argument by its resolved path and its bytes."""
    path = Path(str(target))
    if not path.is_file():  # a module target, or a missing file the run reports itself
        raise NotReusable(f"{target} is not a file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise NotReusable(f"{target} cannot be read: {e.strerror}") from None
    return {"path": str(path.resolve()), "sha256": _digest(data)}


def _workload(given: Mapping[str, Any]) -> dict[str, Any]:
    """The workload arguments with make_workload's defaults filled in: the CLI and the API pass
    different sets of them for the same workload."""
    try:
        bound = inspect.signature(make_workload).bind(**given)
    except TypeError as e:
        raise NotReusable(str(e)) from None  # the run says what is wrong
    bound.apply_defaults()
    args = bound.arguments
    if args.get("model") is not None or args.get("inputs") is not None:
        raise NotReusable("a live model object")  # its weights and code are not ours to hash
    out = {k: _plain(v) for k, v in args.items() if k not in ("model_file", "layer_file")}
    for name in ("model_file", "layer_file"):
        if args.get(name) is not None:
            out[name] = {"given": str(args[name]), **_file(args[name])}
    return out


def reuse_key(
    fn: Callable[..., Any], params: Mapping[str, Any], dev: torch.device, sp: SearchSpace
) -> str:
    """The key of `fn(**params)`'s answer (`fn` is run_advise: its signature names what is
    keyed), on `dev` with the resolved space `sp`. NotReusable where there is none."""
    keyed: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in UNKEYED | RESOLVED:
            continue
        value = params.get(name)
        keyed[name] = _workload(value or {}) if p.kind is p.VAR_KEYWORD else _plain(value)
    material = {
        "format": ENTRY_FORMAT,
        "version": __version__,
        "code": _code_digest(),
        "arguments": keyed,
        "device": str(dev),
        "environment": current_environment(dev).model_dump(mode="json"),
        "space": sp.model_dump(mode="json"),
        "variables": {
            k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and not _where(k)
        },
    }
    return _digest(json.dumps(material, sort_keys=True, default=str).encode())[:32]


def _where(variable: str) -> bool:
    """A cache folder's variable: where things are kept, not what is measured (a run sets
    TORCHINDUCTOR_CACHE_DIR itself, so the next run's key would differ)."""
    return variable.endswith(("CACHE_DIR", "CACHE_PATH"))


def entry_path(key: str) -> Path:
    return cache_dir() / "advice" / f"{key}.json"


@dataclass
class AdviceReuse:
    """The stored answer to this run's question, if any (`advice`), and where this run's answer
    is stored (`store`). `key` is None where the run is not reusable."""

    key: str | None = None
    model_file: bool = False
    advice: Advice | None = None

    @classmethod
    def lookup(
        cls,
        fn: Callable[..., Any],
        params: Mapping[str, Any],
        dev: torch.device,
        sp: SearchSpace,
    ) -> AdviceReuse:
        """`params`: run_advise's arguments by name (its locals: others are not read)."""
        if params.get("storage") is not None:
            return cls()  # a storage the user named is theirs to resume, not ours to cache
        try:
            key = reuse_key(fn, params, dev, sp)
        except NotReusable as e:
            log.debug("advice not reusable: %s", e)
            return cls()
        model_file = (params.get("workload_args") or {}).get("model_file") is not None
        path = entry_path(key)
        if params.get("fresh"):
            path.unlink(missing_ok=True)  # --fresh: nor is this answer given again
            return cls(key, model_file)
        if not path.is_file():
            return cls(key, model_file)
        try:
            entry = StoredAdvice.model_validate_json(path.read_bytes())
            if entry.key != key:
                raise ValueError(f"it holds the key {entry.key}")
            advice = _advice_of(entry)
        except (OSError, ValueError, TypeError, IndexError) as e:
            # Corrupt, cut short, or written by another version: answered afresh, and
            # replaced by this run's answer.
            log.info("ignoring the stored advice %s: %s", path, str(e).splitlines()[0])
            return cls(key, model_file)
        return cls(key, model_file, _with_note(advice, entry))

    def store(self, advice: Advice) -> None:
        """Store a complete answer for the same question asked again; never fails the run."""
        if self.key is None or advice.config.result is None:
            return
        why = partial(advice)
        if why is not None:
            log.debug("advice not stored for reuse: %s", why)
            return
        entry = _entry_of(advice, self.key, self.model_file)
        text = entry.model_dump_json()
        try:
            # Compared as text: a NaN (a gap not measured, a band not run) reads back as NaN,
            # which is never equal to itself.
            if StoredAdvice.model_validate_json(text).model_dump_json() != text:
                log.debug("advice not stored for reuse: it does not read back as written")
                return
            atomic_write(entry_path(self.key), text)
        except (OSError, ValueError) as e:
            log.debug("advice not stored for reuse: %s", e)


def partial(advice: Advice) -> str | None:
    """Why `advice` is not a complete answer to store (None: it is): the budget left something
    unmeasured (a rerun resumes the study and measures it), or a failed step kept the default."""
    result = advice.config.result
    if result is None or result.answer != "final":
        return "not the run's final answer"
    cut = [*advice.outcome.not_measured, *(r for r in advice.outcome.results
                                            if r.stop is not None and r.stop.kind == "out_of_time")]
    if cut:
        return f"the budget left {len(cut)} candidate(s) unmeasured"
    if not advice.stages_done:
        return "the budget left a stage unfinished"
    if advice.pick.kept in ("retime_failed", "check_failed"):
        return "a failed step kept the default"
    return None


def _entry_of(advice: Advice, key: str, model_file: bool) -> StoredAdvice:
    o = advice.outcome
    return StoredAdvice(
        key=key,
        stored=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model_file=model_file,
        config=advice.config,
        entries=o.ledger.entries,
        default=o.ledger.default,
        run=o.ledger.run,
        chosen=advice.pick.chosen.settings,
        fastest=advice.pick.fastest.settings,
        why=advice.pick.why,
        path=list(advice.pick.path),
        multi=o.multi,
        dropped=[(d.what, d.reason) for d in o.dropped],
        study_name=o.study_name,
        environment=o.environment,
        elapsed_s=o.elapsed_s,
        not_measured=o.not_measured,
        screen_note=o.screen_note,
        layer_choices=[
            StoredChoice(
                key=c.group.key,
                names=c.group.names,
                description=c.group.description,
                kept=c.group.kept,
                recipe=c.group.recipe,
                results=c.results,
                chosen=c.chosen,
                why=c.why,
                skipped=c.skipped,
            )
            for c in advice.layer_choices
        ],
    )


def _advice_of(e: StoredAdvice) -> Advice:
    if e.config.result is None:
        raise ValueError("it holds no result")  # stored only with one (`AdviceReuse.store`)
    ledger = Ledger(None, e.default, run=e.run, entries=e.entries)
    outcome = SearchOutcome(
        dropped=[Dropped(what, reason) for what, reason in e.dropped],
        study_name=e.study_name,
        environment=e.environment,
        elapsed_s=e.elapsed_s,
        pareto=e.multi,
        not_measured=list(e.not_measured),
        screen_note=e.screen_note,
        ledger=ledger,
    )
    chosen, fastest = ledger.standing(e.chosen), ledger.standing(e.fastest)
    if chosen is None or fastest is None or ledger.baseline() is None:
        raise ValueError("its pick is not in its ledger")
    pick = Pick(chosen, fastest, e.why, tuple(e.path))
    choices = [
        LayerChoice(
            LayerGroup(c.key, c.names, c.description, None, c.kept, c.recipe),
            dict(c.results),
            c.chosen,
            c.why,
            dict(c.skipped),
        )
        for c in e.layer_choices
    ]
    return Advice(outcome, e.config, pick, choices)


def _with_note(advice: Advice, entry: StoredAdvice) -> Advice:
    """The reused advice, saying so first among its notes (the summary and the config's result)."""
    when = datetime.fromisoformat(entry.stored).astimezone().strftime("%Y-%m-%d %H:%M")
    what = "model file" if entry.model_file else "workload"
    note = (f"reused the advice of the run of {when} (the same {what}, environment, search "
            "space and options): nothing was measured again")  # fmt: skip
    if entry.model_file:
        note += ("; only the model file's own content is compared, not the modules it imports: "
                 "--fresh tunes anew")  # fmt: skip
    else:
        note += "; --fresh tunes anew"
    result = advice.config.result
    assert result is not None  # `_advice_of` checked
    result = result.model_copy(update={"notes": [note, *result.notes]})
    advice.config = advice.config.model_copy(update={"result": result})
    return advice
