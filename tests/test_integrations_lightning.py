"""advisor.integrations.lightning: a real Lightning Trainer on the CPU (one 2-step fit)."""

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
from advisor.config import save_config
from advisor.knobs import GlobalFlags, Settings
from tests.conftest import cpu_config


def _framework() -> Any:
    """lightning.pytorch, or a skip of this file that says why: an ImportError or any other
    error at import (a torchvision whose compiled ops do not load beside this torch raises
    RuntimeError, through torchmetrics)."""
    try:
        import lightning.pytorch
    except Exception as e:  # noqa: BLE001 - whatever the import raised is the reason to skip
        lines = str(e).strip().splitlines()
        why = f"{type(e).__name__}: {lines[0] if lines else ''}"
        pytest.skip(f"lightning does not import here: {why}", allow_module_level=True)
    return lightning.pytorch


pl = _framework()
from advisor.integrations.lightning import AdvisorCallback, networks  # noqa: E402

TUNED = Settings(
    memory_format="channels_last", amp="bf16", cudnn_benchmark=True, layers={"net.0": "unfold_gemm"}
)


class Net(pl.LightningModule):
    """A small conv classifier that records, at each training step, what the step ran with."""

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
        self.steps: list[dict[str, Any]] = []
        self.optimized: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self(x)
        self.steps.append(
            {
                "x_channels_last": x.is_contiguous(memory_format=torch.channels_last),
                "autocast": torch.is_autocast_enabled("cpu"),
                "out_dtype": out.dtype,
                "benchmark": torch.backends.cudnn.benchmark,
            }
        )
        return F.cross_entropy(out.float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.optimized = {id(p) for p in self.parameters()}
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(callbacks: list[Any], **kw: Any) -> Any:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def _loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=4)


@pytest.fixture(autouse=True)
def _global_state_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Trainer(benchmark=..., deterministic=...) set process-wide state: put it back."""
    flags = GlobalFlags.read()
    deterministic = torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # deterministic=True sets it
    yield
    GlobalFlags.write(flags)
    torch.use_deterministic_algorithms(deterministic)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-step fit with a config file: channels_last, bf16, benchmark, one swapped layer."""
    tmp = tmp_path_factory.mktemp("lightning")
    path = save_config(cpu_config(TUNED), tmp / "tuned.json")
    flags_before = GlobalFlags.read()
    model = Net()
    callback = AdvisorCallback(str(path))
    trainer = _trainer([callback])
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, _loader())
    trainer.save_checkpoint(tmp / "tuned.ckpt")
    return {
        "model": model,
        "trainer": trainer,
        "callback": callback,
        "graphs": counters["stats"]["unique_graphs"],
        "ckpt": tmp / "tuned.ckpt",
        "flags_before": flags_before,
        "flags_after": GlobalFlags.read(),
        "advisor_warnings": [str(w.message) for w in caught if w.category is AdvisorWarning],
    }


def test_fit_runs_every_step_as_the_config_says(fitted: dict[str, Any]) -> None:
    model, trainer = fitted["model"], fitted["trainer"]
    assert trainer.global_step == 2 and len(model.steps) == 2
    assert trainer.precision == "bf16-mixed"  # Lightning's own AMP plugin runs the config's bf16
    for step in model.steps:
        assert step["autocast"] and step["out_dtype"] == torch.bfloat16
        assert step["x_channels_last"]  # converted in place at on_train_batch_start
        assert step["benchmark"] is True
    conv0, conv1 = model.net[0], model.net[2]
    assert conv0.weight.is_contiguous(memory_format=torch.channels_last)
    assert getattr(type(conv0), "_advisor_impl", None) == "unfold_gemm"
    assert getattr(type(conv1), "_advisor_impl", "native") == "native"
    # setup() ran before configure_optimizers: the optimizer holds the swapped model's parameters
    assert model.optimized == {id(p) for p in model.parameters()}
    assert fitted["advisor_warnings"] == []


def test_a_config_without_compile_compiles_nothing(fitted: dict[str, Any]) -> None:
    assert fitted["graphs"] == 0 and fitted["callback"].compiled == []
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in fitted["model"].modules())


def test_a_config_that_chose_compile_runs_the_fit_compiled() -> None:
    model, callback = Net(), AdvisorCallback(cpu_config(Settings(compile="default")))
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer([callback])
        trainer.fit(model, _loader())
    assert trainer.global_step == 2 and len(model.steps) == 2
    assert callback.compiled == ["net"] and callback.tuned is None  # torn down
    # The compiled graph ran: one graph holding the whole network, convs and all.
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert counters["stats"]["calls_captured"] >= len(model.net)
    assert model.net._compiled_call_impl is not None  # in place: same module, same keys
    assert set(model.state_dict()) == set(Net().state_dict())
    assert [w for w in caught if w.category is AdvisorWarning] == []


def test_teardown_puts_the_global_flags_back(fitted: dict[str, Any]) -> None:
    assert fitted["flags_after"] == fitted["flags_before"]


def test_tuned_checkpoint_loads_into_the_untuned_model(fitted: dict[str, Any]) -> None:
    tuned = fitted["model"]
    state = torch.load(fitted["ckpt"], weights_only=True)["state_dict"]
    plain = Net()
    assert set(state) == set(plain.state_dict())
    with torch.no_grad():
        for param in plain.parameters():
            param.zero_()  # so only the loaded state can make the outputs agree
    plain.load_state_dict(state)  # strict: the same keys, no advisor-specific ones
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(plain(x), tuned(x), rtol=1e-4, atol=1e-5)  # the trained weights


def _setup(settings: Settings, model: Any = None, **trainer_kw: Any) -> tuple[Any, list[str]]:
    """AdvisorCallback.setup on a real Trainer (no fit): the trainer and the AdvisorWarnings."""
    callback = AdvisorCallback(cpu_config(settings))
    trainer = _trainer([callback], **trainer_kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.setup(trainer, model or Net(), "fit")
        callback.setup(trainer, model or Net(), "validate")  # a conflict: one warning, not two
    return trainer, [str(w.message) for w in caught if w.category is AdvisorWarning]


def test_an_explicit_trainer_precision_wins_with_one_warning_naming_both() -> None:
    trainer, said = _setup(Settings(amp="fp16"), precision="bf16-mixed")
    assert trainer.precision == "bf16-mixed"
    assert len(said) == 1
    assert "amp='fp16'" in said[0] and "Trainer(precision='bf16-mixed')" in said[0]


def test_a_config_at_the_default_leaves_the_trainer_alone() -> None:
    trainer, said = _setup(Settings(), precision="bf16-mixed", benchmark=True)
    assert trainer.precision == "bf16-mixed"
    assert torch.backends.cudnn.benchmark is True  # Trainer(benchmark=True) stays
    assert said == []


def test_deterministic_trainer_keeps_benchmark_off_with_one_warning() -> None:
    _, said = _setup(Settings(cudnn_benchmark=True), deterministic=True)
    assert torch.backends.cudnn.benchmark is False
    assert len(said) == 1 and "cudnn_benchmark=True" in said[0] and "deterministic" in said[0]


def test_the_same_choice_in_trainer_and_config_is_silent() -> None:
    trainer, said = _setup(
        Settings(amp="bf16", cudnn_benchmark=True), precision="bf16-mixed", benchmark=True
    )
    assert trainer.precision == "bf16-mixed" and torch.backends.cudnn.benchmark is True
    assert said == []


def test_fp16_is_not_run_by_lightning_on_a_cpu_and_says_so() -> None:
    trainer, said = _setup(Settings(amp="fp16"))
    assert trainer.precision == "32-true"
    assert len(said) == 1 and "fp16" in said[0] and "CPU" in said[0]


def _callback(trainer: Any) -> AdvisorCallback:
    return next(c for c in trainer.callbacks if isinstance(c, AdvisorCallback))


def _user_compiled(how: str) -> Any:
    from lightning.pytorch.utilities.compile import from_compiled

    model = Net()
    if how == "fit":
        return from_compiled(torch.compile(model))  # what trainer.fit(torch.compile(model)) does
    model.net.compile()
    return model


@pytest.mark.parametrize(
    ("how", "where"), [("fit", "trainer.fit(torch.compile(model))"), ("module", "net.compile()")]
)
def test_a_model_the_user_compiled_keeps_its_compile_with_one_warning(how: str, where: str) -> None:
    trainer, said = _setup(Settings(compile="max-autotune"), _user_compiled(how))
    assert _callback(trainer).compiled == []
    assert len(said) == 1 and "compile='max-autotune'" in said[0] and where in said[0]
    _, said = _setup(Settings(), _user_compiled(how))  # a config without compile: silent
    assert said == []


class Flat(Net):
    """Conv layers hanging on the LightningModule itself, called from its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.convs = nn.ModuleList([nn.Conv2d(4, 4, 1)])


class FlatNoForward(Flat):
    forward = pl.LightningModule.forward  # the steps call self.conv themselves


def test_the_networks_compiled_are_the_outermost_modules_with_a_forward_holding_convs() -> None:
    class Two(Net):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList([nn.Sequential(nn.Conv2d(8, 8, 1)), nn.Linear(8, 8)])

    assert networks(Net()) == ["net"] and networks(Two()) == ["net", "heads.0"]
    assert networks(Flat()) is None  # the LightningModule itself
    trainer, said = _setup(Settings(compile="default"), Flat())
    assert _callback(trainer).compiled == [""] and said == []
    trainer, said = _setup(Settings(compile="default", compile_dynamic=False), FlatNoForward())
    assert _callback(trainer).compiled == [] and len(said) == 1
    assert "trainer.fit(torch.compile(model, mode='default', dynamic=False))" in said[0]


def test_a_strategy_lightning_does_not_compile_under_is_said_once() -> None:
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import Precision

    callback = AdvisorCallback(cpu_config(Settings(compile="default")))
    strategy = SimpleNamespace(root_device=torch.device("cpu"), precision_plugin=Precision())
    trainer = SimpleNamespace(strategy=strategy, precision="32-true")
    with pytest.warns(AdvisorWarning, match="does not run under SimpleNamespace"):
        callback.setup(trainer, Net(), "fit")
    assert callback.compiled == []


def test_a_bad_config_path_fails_when_the_callback_is_made(tmp_path: Path) -> None:
    from advisor.errors import ConfigError

    with pytest.raises(ConfigError, match="config file not found"):
        AdvisorCallback(tmp_path / "missing.json")


def test_the_docs_lightning_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text()
    example = page.split("## PyTorch Lightning", 1)[1].split("```python\n", 1)[1]
    example = example.split("```", 1)[0]
    save_config(
        cpu_config(Settings(memory_format="channels_last", amp="bf16")), tmp_path / "tuned.json"
    )
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(example, "docs/integrations.md", "exec"), scope)  # noqa: S102 - the docs' own code
    assert scope["trainer"].global_step == 2
    assert scope["trainer"].precision == "bf16-mixed"
