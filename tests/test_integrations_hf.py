"""advisor.integrations.hf: a real transformers.Trainer on the CPU (one 2-step train)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from advisor.apply import AdvisorWarning
from advisor.knobs import GlobalFlags, Settings
from tests.conftest import cpu_config


def _framework() -> Any:
    """transformers with the parts these tests use, or a skip of this file that says why: an
    ImportError or any other error at import (a torchvision whose compiled ops do not load
    beside this torch raises RuntimeError). transformers imports lazily, so `Trainer` is
    touched here: that is where its dependencies load."""
    try:
        import transformers

        transformers.Trainer, transformers.TrainingArguments  # noqa: B018 - the lazy imports
    except Exception as e:  # noqa: BLE001 - whatever the import raised is the reason to skip
        root: BaseException = e  # transformers re-raises a dependency's error as its cause
        while root.__cause__ is not None:
            root = root.__cause__
        lines = str(root).strip().splitlines()
        why = f"{type(root).__name__}: {lines[0] if lines else ''}"
        pytest.skip(f"transformers does not import here: {why}", allow_module_level=True)
    return transformers


transformers = _framework()
from advisor.integrations.hf import AdvisorCallback, prepare, training_args_kwargs  # noqa: E402

TUNED = Settings(
    memory_format="channels_last", amp="bf16", cudnn_benchmark=True, layers={"net.0": "unfold_gemm"}
)


class Net(nn.Module):
    """A small conv classifier that returns a loss, as a hub model does; records each call."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 4),
        )
        self.calls: list[dict[str, Any]] = []

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(pixel_values)
        self.calls.append(
            {
                "x_channels_last": pixel_values.is_contiguous(memory_format=torch.channels_last),
                "autocast": torch.is_autocast_enabled("cpu"),
                "logits_dtype": logits.dtype,
                "benchmark": torch.backends.cudnn.benchmark,
            }
        )
        return {"loss": F.cross_entropy(logits.float(), labels), "logits": logits}


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"pixel_values": torch.randn(3, 16, 16, generator=g), "labels": torch.tensor(i % 4)}
        for i in range(8)
    ]


def _args(tmp: Path, **kw: Any) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(tmp),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **kw,
    )


@pytest.fixture(autouse=True)
def _flags_back() -> Iterator[None]:
    flags = GlobalFlags.read()
    yield
    GlobalFlags.write(flags)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-step train: the config's kwargs in TrainingArguments, the rest by the callback."""
    tmp = tmp_path_factory.mktemp("hf")
    cfg = cpu_config(TUNED)
    flags_before = GlobalFlags.read()
    model = Net()
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = transformers.Trainer(
            model=model,
            args=_args(tmp, **training_args_kwargs(cfg)),
            train_dataset=_data(),
            callbacks=[AdvisorCallback(cfg)],
        )
        result = trainer.train()
    return {
        "model": model,
        "result": result,
        "graphs": counters["stats"]["unique_graphs"],
        "flags_before": flags_before,
        "flags_after": GlobalFlags.read(),
        "advisor_warnings": [str(w.message) for w in caught if w.category is AdvisorWarning],
    }


def test_training_args_kwargs_name_only_what_the_config_changes(tmp_path: Path) -> None:
    assert training_args_kwargs(cpu_config(Settings())) == {}  # tf32 absent: None, HF leaves it
    assert training_args_kwargs(cpu_config(TUNED)) == {"bf16": True, "use_cpu": True}
    assert training_args_kwargs(cpu_config(Settings(tf32="off"))) == {"tf32": False}
    assert training_args_kwargs(cpu_config(Settings(tf32="on"))) == {"tf32": True}
    compiled = training_args_kwargs(cpu_config(Settings(compile="max-autotune")))
    assert compiled == {"torch_compile": True, "torch_compile_mode": "max-autotune"}
    args = _args(tmp_path, **training_args_kwargs(cpu_config(TUNED)))  # HF accepts them here
    assert args.bf16 and args.device.type == "cpu"
    args = _args(tmp_path, **compiled)
    assert args.torch_compile and args.torch_compile_mode == "max-autotune"


def test_a_compile_dynamic_training_arguments_cannot_pass_is_said() -> None:
    with pytest.warns(AdvisorWarning, match="compile_dynamic=False"):
        kwargs = training_args_kwargs(
            cpu_config(Settings(compile="default", compile_dynamic=False))
        )
    assert kwargs == {"torch_compile": True, "torch_compile_mode": "default"}


def test_fp16_tuned_on_a_cpu_is_left_out_with_a_warning() -> None:
    with pytest.warns(AdvisorWarning, match="fp16"):
        assert training_args_kwargs(cpu_config(Settings(amp="fp16"))) == {}


def test_two_steps_run_as_the_config_says(trained: dict[str, Any]) -> None:
    model = trained["model"]
    assert trained["result"].global_step == 2 and len(model.calls) == 2
    for call in model.calls:
        assert call["autocast"] and call["logits_dtype"] == torch.bfloat16
        assert call["x_channels_last"]  # the forward pre-hook: HF moved the batch itself
        assert call["benchmark"] is True
    assert model.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert getattr(type(model.net[0]), "_advisor_impl", None) == "unfold_gemm"
    assert trained["advisor_warnings"] == []


def test_a_config_without_compile_compiles_nothing(trained: dict[str, Any]) -> None:
    assert trained["graphs"] == 0


class Quiet(Net):
    """Net without the record: a list growing in a compiled forward recompiles it per call."""

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(pixel_values)
        return {"loss": F.cross_entropy(logits.float(), labels), "logits": logits}


@pytest.mark.slow  # compiles the HF model (5.5 s); the other tests run it eager
def test_a_config_that_chose_compile_trains_compiled(tmp_path: Path) -> None:
    cfg, model = cpu_config(Settings(compile="default")), Quiet()
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = transformers.Trainer(
            model=model,
            args=_args(tmp_path, **training_args_kwargs(cfg)),
            train_dataset=_data(),
            callbacks=[AdvisorCallback(cfg)],
        )
        assert trainer.train().global_step == 2
    # The compiled graph ran: one graph holding the whole model, convs and all.
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert counters["stats"]["calls_captured"] >= len(model.net)
    assert [w for w in caught if w.category is AdvisorWarning] == []


def test_training_end_puts_the_global_flags_back(trained: dict[str, Any]) -> None:
    assert trained["flags_after"] == trained["flags_before"]


def test_tuned_weights_load_into_the_untuned_model(trained: dict[str, Any]) -> None:
    tuned = trained["model"]
    state = tuned.state_dict()
    plain = Net()
    assert set(state) == set(plain.state_dict())
    with torch.no_grad():
        for param in plain.parameters():
            param.zero_()  # so only the loaded state can make the outputs agree
    plain.load_state_dict(state)  # strict: the same keys, no advisor-specific ones
    x, y = torch.randn(2, 3, 16, 16), torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        want = plain(x, y)["logits"]
        got = tuned(x, y)["logits"].float()  # accelerate left the forward under bf16 autocast
    assert (got - want).norm() / want.norm() < 1e-2  # the trained weights, at bf16 precision


def _made(tmp: Path, settings: Settings, **args_kw: Any) -> list[str]:
    """The AdvisorWarnings of making a Trainer with the callback (it applies at on_init_end)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        transformers.Trainer(
            model=Net(),
            args=_args(tmp, **args_kw),
            train_dataset=_data(),
            callbacks=[AdvisorCallback(cpu_config(settings))],
        )
    return [str(w.message) for w in caught if w.category is AdvisorWarning]


def test_amp_the_training_arguments_do_not_run_is_one_warning_naming_both(tmp_path: Path) -> None:
    said = _made(tmp_path, Settings(amp="bf16"), use_cpu=True)
    assert len(said) == 1
    assert "amp='bf16'" in said[0] and "TrainingArguments(bf16=False" in said[0]
    assert "training_args_kwargs" in said[0]


def test_compile_follows_the_rule_against_the_training_arguments(tmp_path: Path) -> None:
    chose = Settings(compile="default")
    said = _made(tmp_path, chose, use_cpu=True, torch_compile_mode="max-autotune")
    assert len(said) == 1 and "compile='default'" in said[0]
    assert "torch_compile_mode='max-autotune'" in said[0] and "keeping 'max-autotune'" in said[0]
    said = _made(tmp_path, chose, use_cpu=True)  # the config's kwargs left out
    assert len(said) == 1 and "TrainingArguments(torch_compile=False)" in said[0]
    assert "training_args_kwargs" in said[0]
    assert _made(tmp_path, chose, use_cpu=True, torch_compile=True) == []  # the same choice
    assert _made(tmp_path, Settings(), use_cpu=True, torch_compile=True) == []  # config: off


def test_a_config_at_the_default_leaves_the_training_arguments_and_flags_alone(
    tmp_path: Path,
) -> None:
    torch.backends.cudnn.benchmark = True  # set by the user before training
    assert _made(tmp_path, Settings(), bf16=True, use_cpu=True) == []
    assert torch.backends.cudnn.benchmark is True


def test_prepare_alone_converts_model_and_inputs() -> None:
    model = prepare(Net(), cpu_config(TUNED))
    prepare(model, cpu_config(TUNED))  # twice: one input hook, not two
    assert model.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    model(torch.randn(2, 3, 16, 16), labels=torch.zeros(2, dtype=torch.long))
    assert model.calls[-1]["x_channels_last"]
    assert torch.backends.cudnn.benchmark is True
