"""Item 5: absurd sizes and unparseable specs are one line (exit 2), found before anything is
allocated: no traceback from the allocator, the int64 conversion or Python's parser."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests._cli import advisor_cli, advisor_cli_many, one_line_error

LAYER = "Conv2d(4,4,3)"
MINUS_1000 = "Conv2d(4, 4, " + "-" * 1000 + "3)"
MINUS_100000 = "Conv2d(4, 4, " + "-" * 100_000 + "3)"


CASES = [
    pytest.param(
        ["--layer", LAYER, "--input-shape", "4096,4,4096,4096"],
        ["4096x4x4096x4096", "1.0 TiB", "input"],
        id="1TiB-input",
    ),
    pytest.param(
        [
            "--layer",
            "Conv2d(3,4,3)",
            "--input-shape",
            "1,3,8,8",
            "--batch-sizes",
            "1,100000000000",
        ],
        ["100000000000x3x8x8", "TiB", "input"],
        id="batch-sizes",
    ),  # fmt: skip
    pytest.param(
        [
            "--layer",
            "Conv2d(3,4,3)",
            "--input-shape",
            "1,3,8,8",
            "--input-shape",
            "1,3,8,8",
            "--input-shape",
            "100000,3,100000,1000",
        ],
        ["100000x3x100000x1000", "GiB"],
        id="shape-set",
    ),  # fmt: skip
    pytest.param(
        ["--layer", "Conv2d(3,4,3)", "--input-shape", "1,3,8,99999999999999999999999"],
        ["99999999999999999999999", "64-bit"],
        id="beyond-int64",
    ),
    pytest.param(
        [
            "--layer",
            "Conv2d(3,4,3)",
            "--input-shape",
            "1,3,8,8",
            "--batch-sizes",
            "1,99999999999999999999999",
        ],
        ["99999999999999999999999", "64-bit"],
        id="batch-beyond-int64",
    ),  # fmt: skip
    pytest.param(
        ["--layer", "Conv2d(3, 99999999999999999999999, 3)", "--input-shape", "1,3,8,8"],
        ["out_channels", "64-bit"],
        id="channels-beyond-int64",
    ),
    pytest.param(
        ["--layer", "Conv2d(100000, 100000, 1000)", "--input-shape", "1,100000,8,8"],
        ["weight", "100000x100000x1000x1000", "PiB"],
        id="huge-weight",
    ),
    pytest.param(
        [
            "--layer",
            "ConvTranspose2d(4, 4, 3, stride=100000)",
            "--input-shape",
            "1,4,1000,1000",
        ],
        ["output", "needs"],
        id="huge-output",
    ),  # fmt: skip
    pytest.param(
        ["--layer", MINUS_1000, "--input-shape", "1,4,8,8"], ["kernel_size"], id="minus-1000"
    ),
    pytest.param(
        ["--layer", MINUS_100000, "--input-shape", "1,4,8,8"], ["layer"], id="minus-100000"
    ),
    pytest.param(
        ["--layer", "Conv2d(4, 4, " + "-" * 5000 + "3)", "--input-shape", "1,4,8,8"],
        ["cannot parse layer"],
        id="minus-5000",
    ),
    pytest.param(
        [
            "--layer",
            "Conv2d(4, 4, " + "(" * 2000 + "3" + ")" * 2000 + ")",
            "--input-shape",
            "1,4,8,8",
        ],
        ["cannot parse layer"],
        id="nested-parens",
    ),  # fmt: skip
    pytest.param(
        ["--layer", "Conv2d(4, 4, 3, dtype=" + "-" * 1000 + "x)", "--input-shape", "1,4,8,8"],
        ["dtype"],
        id="dtype-minus-1000",
    ),
    pytest.param(
        ["--layer", "Conv2d(4, 4, {[1]: 2})", "--input-shape", "1,4,8,8"],
        ["kernel_size"],
        id="unhashable-literal",
    ),
    pytest.param(
        ["tests/data/tiny_cnn.py", "--batch-sizes", "2,100000000000"],
        ["batch size 100000000000", "GiB"],
        id="model-file-batch-sizes",
    ),
]


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("sizes") / "never.json"
    cases = {
        p.id: ["advise", *p.values[0], "--device", "cpu", "--storage", "memory", "--out", str(out),
               "--in-process"]
        for p in CASES
    }  # fmt: skip
    got = advisor_cli_many(cases)
    assert not out.exists()
    return got


@pytest.mark.parametrize("args,needles", CASES)
def test_absurd_input_is_one_line(
    results: dict[str, subprocess.CompletedProcess[str]],
    request: pytest.FixtureRequest,
    args: list[str],
    needles: list[str],
) -> None:
    case = request.node.callspec.id
    one_line_error(results[case], *needles)


def test_deeply_nested_layer_file_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "layer.json"
    spec.write_text('{"layer": "Conv2d(4, 4, 3)", "input_shape": ' + "[" * 100_000 + "]" * 100_000
                    + "}")  # fmt: skip
    r = advisor_cli("advise", "--layer-file", str(spec), "--device", "cpu",
                    "--out", str(tmp_path / "never.json"))  # fmt: skip
    one_line_error(r, "layer spec", "nested")
