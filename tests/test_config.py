import json

import pytest
import torch

from advisor.config import Config, config_schema, load_config, save_config
from advisor.device.environment import current_environment
from advisor.errors import ConfigError
from advisor.knobs import Settings


def _config(**settings) -> Config:
    return Config(
        advisor_version="0.1.0",
        mode="train",
        settings=Settings(**settings),
        environment=current_environment("cpu"),
        workload={"kind": "layer", "description": "Conv2d(3, 8, 3)"},
        space="cpu",
    )


def test_round_trip(tmp_path) -> None:
    cfg = _config(memory_format="channels_last", amp="bf16", layers={"0": "unfold_gemm"})
    path = save_config(cfg, tmp_path / "sub" / "tuned.json")
    assert load_config(path) == cfg
    assert not list(path.parent.glob("*.tmp"))  # written atomically


def test_hand_edited_settings_are_read(tmp_path) -> None:
    path = save_config(_config(), tmp_path / "t.json")
    data = json.loads(path.read_text())
    data["settings"]["memory_format"] = "channels_last"
    data["settings"]["layers"] = {"conv1": "triton"}
    path.write_text(json.dumps(data))
    cfg = load_config(path)
    assert cfg.settings.memory_format == "channels_last"
    assert cfg.settings.layers == {"conv1": "triton"}


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d["settings"].update(warp=1), "settings.warp: unknown field"),
        (lambda d: d["settings"].update(amp="fp8"), "settings.amp"),
        (lambda d: d.update(schema_version=99), "schema_version 99"),
        (lambda d: d.pop("settings"), "not an advisor config"),
        (lambda d: d.update(extra=1), "extra: unknown field"),
    ],
)
def test_invalid_configs_are_rejected(tmp_path, mutate, needle: str) -> None:
    path = save_config(_config(), tmp_path / "t.json")
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_corrupt_and_foreign_files(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "settings": ')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
    foreign = tmp_path / "package.json"
    foreign.write_text('{"name": "left-pad"}')
    with pytest.raises(ConfigError, match="not an advisor config"):
        load_config(foreign)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.json")


def test_schema_describes_settings() -> None:
    schema = config_schema()
    assert "settings" in schema["properties"]
    settings = schema["$defs"]["Settings"]["properties"]
    assert set(settings) >= {
        "memory_format",
        "tf32",
        "amp",
        "cudnn_benchmark",
        "conv_impl",
        "layers",
    }


def test_atomic_write_all_writes_every_file(tmp_path) -> None:
    from advisor.config import atomic_write_all

    a, b = tmp_path / "new" / "a.json", tmp_path / "new" / "a.trials.csv"
    atomic_write_all({a: "{}\n", b: b"x,y\n"})
    assert a.read_text() == "{}\n" and b.read_bytes() == b"x,y\n"
    assert sorted(p.name for p in a.parent.iterdir()) == ["a.json", "a.trials.csv"]


def test_atomic_write_all_is_all_or_nothing(tmp_path) -> None:
    """The second file cannot be written (a directory is in its place): the first, already
    renamed into place, is put back as it was; nothing else is left behind; the error names the
    file that failed."""
    from advisor.config import atomic_write_all
    from advisor.errors import OutputError

    config, csv = tmp_path / "tuned.json", tmp_path / "tuned.trials.csv"
    config.write_text("old config")
    csv.mkdir()
    with pytest.raises(OutputError, match=r"cannot write .*tuned\.trials\.csv") as info:
        atomic_write_all({config: "new config", csv: "new trials"})
    assert isinstance(info.value, OSError)  # what callers caught before
    assert config.read_text() == "old config"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned.json", "tuned.trials.csv"]
    # A new config is removed again
    config.unlink()
    with pytest.raises(OutputError):
        atomic_write_all({config: "new config", csv: "new trials"})
    assert not config.exists()


def test_atomic_write_all_rolls_back_a_failed_rename(tmp_path, monkeypatch) -> None:
    import os

    from advisor.config import atomic_write_all
    from advisor.errors import OutputError

    config, csv = tmp_path / "tuned.json", tmp_path / "tuned.trials.csv"
    config.write_text("old config")
    real_replace = os.replace

    def replace(src, dst):  # noqa: ANN001, ANN202
        if str(dst) == str(csv):
            raise PermissionError(13, "Permission denied")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputError, match="tuned.trials.csv: Permission denied"):
        atomic_write_all({config: "new config", csv: "new trials"})
    monkeypatch.undo()
    assert config.read_text() == "old config"
    assert [p.name for p in tmp_path.iterdir()] == ["tuned.json"]


def test_check_outputs_before_a_search(tmp_path) -> None:
    from advisor.config import check_outputs, output_paths
    from advisor.errors import OutputError

    check_outputs(output_paths(tmp_path / "to" / "be" / "made" / "tuned.json"))
    assert not (tmp_path / "to").exists()  # checked, not made
    (tmp_path / "tuned.layers.csv").mkdir()
    with pytest.raises(OutputError, match=r"tuned\.layers\.csv: it is a directory"):
        check_outputs(output_paths(tmp_path / "tuned.json"))
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is not a directory"):
        check_outputs(output_paths(tmp_path / "file" / "tuned.json"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_cpu_environment_names_its_vector_isa() -> None:
    # Two CPUs a virtual machine names alike ("AMD EPYC") differ in what decides bf16's speed.
    env = current_environment("cpu")
    assert env.capability is not None
    assert env.capability.split()[0] == torch.backends.cpu.get_cpu_capability()
    other = env.model_copy(update={"capability": "AVX512 avx512_bf16"})
    assert other.fingerprint_of_fields() != env.fingerprint
    assert any(d.startswith("capability:") for d in env.mismatches(other))
