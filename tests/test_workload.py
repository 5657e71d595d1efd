import pytest
import torch

from advisor.errors import ModelFileError, SpecError
from advisor.workload.build import layer_workload, model_workload
from advisor.workload.info import ModelFileInfo
from advisor.workload.layer_call import parse_layer_call
from advisor.workload.layer_spec import layer_spec


@pytest.mark.parametrize(
    "text,shape,kind",
    [
        ("Conv2d(2048, 2048, 3, padding=1, groups=2048)", "2,2048,8,8", "Conv2d"),
        ("conv1d(4, 8, 5, stride=2, padding='same')".replace("stride=2, ", ""), "2,4,32", "Conv1d"),
        ("nn.Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)", "1,2,4,8,8", "Conv3d"),
        ("ConvTranspose2d(8, 8, 2, stride=2, groups=8)", "2,8,4,4", "ConvTranspose2d"),
        ("torch.nn.ConvTranspose1d(4, 2, 3, 2, 1, 1)", "1,4,9", "ConvTranspose1d"),
        ("CONVTRANSPOSE3D(2, 2, 3, dilation=2)", "1,2,5,5,5", "ConvTranspose3d"),
    ],
)
def test_layer_specs_parse_like_pytorch(text: str, shape: str, kind: str) -> None:
    spec = layer_spec(text, input_shape=shape)
    assert spec.kind == kind
    module = spec.build()
    assert type(module).__name__ == kind
    x = layer_workload(spec).make_call(torch.device("cpu"))[0][0]
    assert list(x.shape) == [int(v) for v in shape.split(",")]
    assert x.abs().sum() > 0  # fresh random inputs, never zeros


def test_positional_transpose_arguments_follow_pytorch_order() -> None:
    fields = parse_layer_call("ConvTranspose2d(4, 2, 3, 2, 1, 1, 2, False, 1)")
    assert fields["output_padding"] == 1 and fields["groups"] == 2 and fields["bias"] is False


@pytest.mark.parametrize(
    "text,shape,needle",
    [
        ("Conv2d(3, 16, 3", "1,3,8,8", "cannot parse"),
        ("Linear(3, 16)", "1,3", "unknown layer"),
        ("Conv2d(3, 16, (3, 3, 3))", "1,3,8,8", "kernel_size"),
        ("Conv2d(3, 16, 3, groups=2)", "1,3,8,8", "groups"),
        ("Conv2d(3, 16, __import__('os'))", "1,3,8,8", "not a literal"),
        ("Conv2d(3, 16, 3, bogus=1)", "1,3,8,8", "bogus"),
        ("Conv2d(3, 16, 3)", "1,4,8,8", "channels"),
        ("Conv2d(3, 16, 3)", "1,3,8", "dims"),
        ("Conv2d(3, 16, 3)", "1,3,a,8", "integers"),
        ("Conv2d(3, 16, 3, stride=0)", "1,3,8,8", "stride"),
        ("Conv2d(3, 16, 3, padding='full')", "1,3,8,8", "padding"),
    ],
)
def test_bad_specs_give_one_line_naming_the_problem(text: str, shape: str, needle: str) -> None:
    with pytest.raises(SpecError) as e:
        layer_spec(text, input_shape=shape)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_spec_too_small_input_fails_when_built() -> None:
    with pytest.raises(SpecError, match="cannot run"):
        layer_workload(layer_spec("Conv2d(3, 16, 9)", input_shape="1,3,4,4"))


def test_spec_from_yaml_and_json_files(tmp_path) -> None:
    y = tmp_path / "layer.yaml"
    y.write_text(
        "kind: conv2d\nin_channels: 3\nout_channels: 8\nkernel_size: [3, 3]\n"
        "padding: same\ninput_shape: [1, 3, 16, 16]\n"
    )
    assert layer_spec(file=y).padding == "same"
    j = tmp_path / "layer.json"
    j.write_text('{"layer": "Conv2d(3, 8, 3)", "input_shape": [1, 3, 16, 16], "dtype": "bfloat16"}')
    spec = layer_spec(file=j)
    assert spec.kind == "Conv2d" and spec.dtype == "bfloat16"
    with pytest.raises(SpecError, match="not found"):
        layer_spec(file=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed")
    with pytest.raises(SpecError, match="cannot read"):
        layer_spec(file=bad)


def test_model_file_loads(small_model_file: str) -> None:
    w = model_workload(small_model_file)
    m1, m2 = w.make_model(), w.make_model()
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # same weights every time
    (x,), _ = w.make_call(torch.device("cpu"))
    assert x.shape == (2, 3, 16, 16)
    assert isinstance(w.info, ModelFileInfo) and w.info.kind == "model"
    other = model_workload(small_model_file, build="build_other")
    assert isinstance(other.make_model(), torch.nn.Conv2d)


def test_model_from_module_path() -> None:
    w = model_workload("advisor.examples.small_cnn:build_model")
    assert isinstance(w.info, ModelFileInfo) and w.info.build == "build_model"
    assert isinstance(w.make_model(), torch.nn.Sequential)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"target": "nope/missing.py"}, "not found"),
        ({"build": "no_such"}, "defines no no_such()"),
        ({"build": "raising_model"}, "weights not found"),
        ({"inputs": "bad_inputs"}, "fails on"),
        ({"target": "no_such_module_xyz:build"}, "cannot import module"),
    ],
)
def test_bad_model_files(small_model_file: str, kwargs: dict, needle: str) -> None:
    target = kwargs.pop("target", small_model_file)
    with pytest.raises(ModelFileError) as e:
        model_workload(target, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_model_file_with_syntax_error(tmp_path) -> None:
    f = tmp_path / "broken.py"
    f.write_text("def build_model(:\n    pass\n")
    with pytest.raises(ModelFileError, match="SyntaxError"):
        model_workload(f)


def test_model_file_weights_do_not_depend_on_the_process(tmp_path) -> None:
    """A file that seeds nothing still gives the same weights in every process that loads it (the
    advisor's isolated workers), and loading it leaves the caller's random state alone."""
    f = tmp_path / "unseeded.py"
    f.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Conv2d(3, 4, 3)\n"
        "def example_inputs():\n    return (torch.randn(1, 3, 8, 8),)\n"
    )
    state = torch.get_rng_state()
    loaded = model_workload(f)
    assert torch.equal(torch.get_rng_state(), state)
    first = loaded.make_model().weight
    torch.manual_seed(1234)  # another process, another random state
    assert torch.equal(model_workload(f).make_model().weight, first)
