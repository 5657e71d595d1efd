"""A model file the probe loaded is loaded in the advise process only when a stage needs it
(advisor.workload.deferred): its imports are not paid twice where nothing here uses the model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import advisor
from advisor.workload.args import make_workload
from advisor.workload.deferred import DeferredWorkload
from tests.conftest import DATA

CPU = torch.device("cpu")
# A model file that says which processes imported it, and sets a global flag at import.
MARKED = (
    "import os, torch\nfrom torch import nn\n"
    "with open(os.environ['IMPORT_LOG'], 'a') as f:\n"
    "    f.write(f'{os.getpid()}\\n')\n"
    "torch.backends.mkldnn.enabled = False  # at import: must not reach the caller\n"
    "def build_model():\n"
    "    torch.manual_seed(0)\n"
    "    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),\n"
    "                         nn.Conv2d(8, 8, 3, padding=1))\n"
    "def example_inputs():\n    return (torch.randn(2, 3, 24, 24),)\n"
)


@pytest.fixture
def marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    path, log = tmp_path / "marked_net.py", tmp_path / "imports.log"
    path.write_text(MARKED)
    monkeypatch.setenv("IMPORT_LOG", str(log))
    enabled = torch.backends.mkldnn.enabled
    yield path, log
    torch.backends.mkldnn.enabled = enabled


def _importers(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def test_a_deferred_workload_loads_on_first_use_and_once(marked: tuple[Path, Path]) -> None:
    path, log = marked
    loaded_here = make_workload(model_file=str(path))
    torch.backends.mkldnn.enabled = True  # what the caller had
    before = len(_importers(log))
    seen: list[float] = []
    w = DeferredWorkload(loaded_here.info.model_dump(mode="json"), torch.float32, seen.append)
    # what the search's plan and the config file read: no load
    assert w.info == loaded_here.info and w.name == loaded_here.name and not w.is_layer
    assert w.param_dtype == torch.float32 and w.input_shapes == [[2, 3, 24, 24]]
    assert len(_importers(log)) == before and w.load_s is None and "not loaded" in repr(w)
    # the model and its inputs: loaded once, with the file's global flag undone
    args, _ = w.make_call(CPU, seed=3)
    assert args[0].shape == (2, 3, 24, 24)
    want, _ = loaded_here.make_call(CPU, seed=3)
    assert torch.equal(args[0], want[0])  # the same draw from the same seed
    out = w.make_model()(args[0])
    assert torch.allclose(out, loaded_here.make_model()(args[0]))  # same weights (seeded)
    assert torch.backends.mkldnn.enabled
    assert len(_importers(log)) == before + 1 and len(seen) == 1 and seen[0] == w.load_s
    assert w.shape_cases and w.make_model() is not None and len(seen) == 1


def test_only_a_model_file_is_deferred() -> None:
    layer = make_workload(layer="Conv2d(3, 8, 3)", input_shape="1,3,8,8")
    with pytest.raises(TypeError, match="model file"):
        DeferredWorkload(layer.info, torch.float32)


@pytest.mark.slow  # two isolated runs: probe children, workers and a per-layer stage (20 s)
def test_an_isolated_run_loads_the_model_here_only_for_the_per_layer_stage(
    marked: tuple[Path, Path],
) -> None:
    path, log = marked
    kw = dict(model_file=str(path), mode="train", device="cpu", isolate=True, storage=None)
    quick = advisor.advise(**kw, effort="quick", space=str(DATA / "fast_cpu.yaml"))
    assert os.getpid() not in _importers(log)  # the probe's child loaded it; nothing here did
    assert not any("model's load" in k for k in quick.config.result.stage_s)
    log.unlink()
    full = advisor.advise(**kw, space=str(DATA / "per_layer_cpu.yaml"))
    assert _importers(log).count(os.getpid()) == 1  # for the per-layer stage, once
    stage_s = full.config.result.stage_s
    assert stage_s.get("per-layer: the model's load in this process", 0.0) > 0, stage_s
    # the same description either way (the study differs: another space)
    assert {**full.config.workload, "study": None} == {**quick.config.workload, "study": None}
