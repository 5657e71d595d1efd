"""A workload's typed info: the JSON it writes (config files, study attrs, study names) is what
earlier versions wrote as a plain dict; old JSON loads; a model file's layer is rebuilt with the
model's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from advisor.config import Config
from advisor.device.environment import current_environment
from advisor.errors import ConfigError, ModelFileError
from advisor.knobs import Settings
from advisor.stages.layer_groups import layer_groups
from advisor.workload.build import (
    layer_workload,
    model_workload,
    object_workload,
)
from advisor.workload.info import LayerInfo, ModelFileInfo, ObjectInfo, parse_info
from advisor.workload.layer_spec import layer_spec
from advisor.workload.rebuild import workload_from_info
from advisor.workload.shape_sets import with_shape_set
from tests.conftest import DATA

CPU = torch.device("cpu")
TINY = str(DATA / "tiny_cnn.py")
SPEC = {
    "kind": "Conv2d", "in_channels": 3, "out_channels": 4, "kernel_size": 3, "stride": 1,
    "padding": 0, "output_padding": 0, "dilation": 1, "groups": 1, "bias": True,
    "padding_mode": "zeros", "input_shape": [1, 3, 16, 16], "dtype": "float32",
    "input_dtype": None, "input_layout": None, "first_layer": False,
}  # fmt: skip


def _text(info: LayerInfo | ModelFileInfo | ObjectInfo) -> str:
    return json.dumps(info.model_dump(mode="json"))  # key order too: a config file's text


def test_layer_info_json_is_unchanged() -> None:
    """The dict earlier versions hashed into the study name: same workload, same study."""
    w = layer_workload(layer_spec("Conv2d(3, 4, 3)", input_shape="1,3,16,16"))
    old = {"kind": "layer", "spec": SPEC, "description": "Conv2d(3, 4, 3) on 1x3x16x16 float32"}
    assert _text(w.info) == json.dumps(old)  # no `source` or `shape_set` key when unset
    ws = with_shape_set(w, batch_sizes=[1, 2], weights=[1, 3])
    shape_set = {"shapes": None, "batch_sizes": [1, 2], "weights": [1, 3],  # ints stay ints
                 "input_shapes": [[[1, 3, 16, 16]], [[2, 3, 16, 16]]]}  # fmt: skip
    old = {**old, "description": old["description"] + " over 2 shapes", "shape_set": shape_set}
    assert _text(ws.info) == json.dumps(old)


def test_model_info_json_is_unchanged() -> None:
    w = model_workload(TINY)
    assert isinstance(w.info, ModelFileInfo)
    old = {"kind": "model", "target": TINY, "build": "build_model", "inputs": "example_inputs",
           "input_shapes": [[2, 3, 16, 16]], "description": "tiny_cnn.py (Sequential)"}  # fmt: skip
    assert _text(w.info) == json.dumps(old)
    obj = object_workload(nn.Conv2d(3, 4, 3), (torch.randn(2, 3, 8, 8),))
    assert isinstance(obj.info, ObjectInfo) and not obj.info.recreatable
    dumped = obj.info.model_dump(mode="json")
    assert list(dumped) == ["kind", "target", "architecture", "input_shapes", "description"]
    assert dumped["kind"] == "model" and dumped["target"] == "<Conv2d object>"


def test_old_json_loads_as_the_right_kind() -> None:
    """Both model kinds say "kind": "model"; a model file is the one with `build`. A config's
    workload also names the study."""
    layer = parse_info({"kind": "layer", "spec": SPEC, "description": "d", "study": "s@x"})
    assert isinstance(layer, LayerInfo) and layer.spec.kernel_size == 3 and layer.source is None
    model = parse_info({"kind": "model", "target": "m.py", "build": "b", "inputs": "i",
                        "input_shapes": [[1, 3]], "description": "d"})  # fmt: skip
    obj = parse_info({"kind": "model", "target": "<M object>", "architecture": "abc",
                      "input_shapes": [[1, 3]], "description": "d"})  # fmt: skip
    assert isinstance(model, ModelFileInfo) and isinstance(obj, ObjectInfo)
    with pytest.raises(ConfigError, match="unknown kind 'graph'"):
        parse_info({"kind": "graph", "description": "d"})
    with pytest.raises(ConfigError, match="invalid workload description: layer.spec"):
        parse_info({"kind": "layer", "description": "d"})
    with pytest.raises(ModelFileError, match="cannot rebuild workload 'd' in a worker"):
        workload_from_info(obj)


def test_config_workload_is_typed_on_demand() -> None:
    w = with_shape_set(model_workload(TINY), batch_sizes=[1, 2])
    cfg = Config(
        advisor_version="0.1.0",
        mode="infer",
        settings=Settings(),
        environment=current_environment("cpu"),
        workload={**w.info.model_dump(mode="json"), "study": "infer-0123@abc"},
        space="cpu",
    )
    assert cfg.workload_info == w.info
    again = workload_from_info(cfg.workload)  # what the benchmarks' fresh re-time does
    assert again.info == w.info and len(again.shape_cases) == 2


def test_layer_of_a_model_file_is_rebuilt_with_its_weights() -> None:
    model = model_workload(TINY)
    groups = {g.names: g for g in layer_groups(model, Settings(), CPU)}
    depthwise = groups[("3",)].workload
    info = depthwise.info
    assert isinstance(info, LayerInfo) and info.source is not None
    assert (info.source.target, info.source.module) == (TINY, "3")
    rebuilt = workload_from_info(json.loads(info.model_dump_json()))  # as a worker gets it
    assert rebuilt.info == info
    weights = model.make_model().get_submodule("3").state_dict()
    for k, v in rebuilt.make_model().state_dict().items():
        assert torch.equal(v, weights[k])
    spec_only = workload_from_info(info.model_copy(update={"source": None}))
    assert not torch.equal(spec_only.make_model().weight, weights["weight"])


def test_layer_object_models_have_no_source() -> None:
    """A live model's layers cannot be found again by another process: no source."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    w = object_workload(net, (torch.randn(1, 3, 8, 8),))
    (group,) = layer_groups(w, Settings(), CPU)
    assert isinstance(group.workload.info, LayerInfo) and group.workload.info.source is None


def test_a_changed_model_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "net.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())\n"
        "def example_inputs():\n    return (torch.randn(1, 3, 8, 8),)\n"
    )
    (group,) = layer_groups(model_workload(path), Settings(), CPU)
    # (each edit changes the file's size: a stale bytecode cache cannot hide it)
    path.write_text(path.read_text().replace("Conv2d(3, 8, 3)", "Conv2d(3, 8, 5, padding=2)"))
    with pytest.raises(ModelFileError, match=r"layer '0' of .* is now Conv2d\(3, 8, \(5, 5\)"):
        workload_from_info(group.workload.info)
    path.write_text(path.read_text().replace("nn.Conv2d(3, 8, 5, padding=2), ", ""))
    with pytest.raises(ModelFileError, match="layer '0' of .*: 'ReLU' object has no attribute"):
        workload_from_info(group.workload.info)


def test_the_environment_follows_the_thread_count() -> None:
    # It was cached by device only: a process that had changed its threads recorded the old
    # count in its configs (a report in a fresh process then found "another machine").
    import torch

    from advisor.device.environment import current_environment

    threads = torch.get_num_threads()
    before = current_environment("cpu")
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert current_environment("cpu").cpu_threads == torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    assert current_environment("cpu") == before
