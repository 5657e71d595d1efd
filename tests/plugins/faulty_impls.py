"""Test-only conv implementations that misbehave on purpose, to prove the search survives them.

Registered only when this module is imported, i.e. when $ADVISOR_PLUGINS names it
(ADVISOR_PLUGINS=tests.plugins.faulty_impls with the repository root on PYTHONPATH). Isolated
workers inherit the variable, so they register the same implementations.

- test_crash: the process dies with SIGSEGV in forward (like a bad kernel).
- test_hang:  forward never returns (like a deadlocked kernel).
- test_oom:   forward asks for an impossible allocation (out of memory).
- test_probe: computes like native, and logs PyTorch's global flags as they are when the candidate
  is set up (before its own flags apply: what the previous trial left) and in forward (the
  candidate's own flags, and a checksum of the layer's weight) to the JSON-lines file
  $ADVISOR_TEST_PROBE_LOG.
- test_leaky: computes like native, but changes global flags behind the advisor's back while it is
  set up, so a worker that did not restore its state would leak them into the next trial.
- test_scaled: wrong on purpose, subtly: the weights are off by 1e-3 relative (invisible in a
  BatchNorm network's outputs, so only the per-layer check can catch it).
- test_tap: wrong on purpose: the kernel's first tap (every [..., 0, 0]) is dropped.
- test_slow: computes like native, then sleeps 20 ms: honestly slower, for racing tests.
- test_cold: computes like native, but the first forward of each module sleeps COLD_S first, as a
  Triton kernel's first call compiles and autotunes: for time-budget tests.
- test_threads: computes like native, but its forward sets torch.set_num_threads(1), switches
  deterministic algorithms on and leaves autocast enabled, as a careless model might.
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch
from torch import Tensor, nn

from advisor.impls import register
from advisor.impls._swap import SwappingImpl, original_class
from advisor.impls.base import ConvSignature
from advisor.knobs import GlobalFlags

# test_threads switches deterministic algorithms on, and putting them back after its trial calls
# torch.use_deterministic_algorithms, whose first call imports torch._inductor.config: about 2 s
# on a 2-core CPU, 5 s on a busy one, more than the short limits the trials get in these tests.
# Called once here (a no-op: the current values), at the worker's start-up, which those limits
# do not cover: the trials then time the candidates alone.
torch.use_deterministic_algorithms(
    torch.are_deterministic_algorithms_enabled(),
    warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
)


class _TestImpl(SwappingImpl):
    """Plain (non-transposed) convs with zero padding, anywhere."""

    description = "test only"

    def layer_reason(self, sig: ConvSignature) -> str | None:
        if sig.transposed or sig.padding_mode != "zeros":
            return "test implementations take plain zero-padded convs only"
        return None

    def why_not(
        self, sig: ConvSignature, *, device: torch.device, dtype: torch.dtype
    ) -> str | None:
        return self.layer_reason(sig)

    def module_forward(
        self,
        module: nn.Module,
        input: Tensor,
        padding: tuple[int, ...] | str,
        output_padding: list[int] | None,
    ) -> Tensor:
        return _native(module, input)


def _native(module: nn.Module, input: Tensor) -> Tensor:
    return original_class(module)._conv_forward(module, input, module.weight, module.bias)


class CrashImpl(_TestImpl):
    name = "test_crash"
    class_prefix = "TestCrash"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)  # the signal is delivered first; never reached
        return _native(module, input)


class HangImpl(_TestImpl):
    name = "test_hang"
    class_prefix = "TestHang"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        while True:
            time.sleep(3600)


class OomImpl(_TestImpl):
    name = "test_oom"
    class_prefix = "TestOom"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        # 1 EiB: beyond any address space, so the allocator fails at once (on CPU a RuntimeError
        # "can't allocate memory", on CUDA torch.OutOfMemoryError) instead of swapping.
        torch.empty(2**60, dtype=torch.uint8, device=input.device)
        return _native(module, input)


def _log_flags(when: str, **extra: object) -> None:
    path = os.environ.get("ADVISOR_TEST_PROBE_LOG")
    if path:
        state = {
            **GlobalFlags.read(),
            "threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
        }
        line = {"pid": os.getpid(), "when": when, **state, **extra}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


class ProbeImpl(_TestImpl):
    name = "test_probe"
    class_prefix = "TestProbe"

    def wrap(self, module: nn.Module) -> nn.Module:
        _log_flags("setup")  # apply_settings swaps layers before it sets the candidate's flags
        return super().wrap(module)

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        # Which weights the candidate computes with (a layer of a model: the model's own).
        _log_flags("forward", weight_sum=float(module.weight.detach().double().sum()))
        return _native(module, input)


class LeakyImpl(_TestImpl):
    name = "test_leaky"
    class_prefix = "TestLeaky"

    def wrap(self, module: nn.Module) -> nn.Module:
        # Before GlobalFlags saves the "old" values: its restore would put these back.
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        torch.set_default_dtype(torch.float64)
        return super().wrap(module)


def _with_weight(module: nn.Module, input: Tensor, weight: Tensor) -> Tensor:
    return original_class(module)._conv_forward(module, input, weight, module.bias)


class ScaledImpl(_TestImpl):
    name = "test_scaled"
    class_prefix = "TestScaled"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        return _with_weight(module, input, module.weight * (1 + 1e-3))


class TapImpl(_TestImpl):
    name = "test_tap"
    class_prefix = "TestTap"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        mask = torch.ones_like(module.weight)
        mask[(slice(None), slice(None)) + (0,) * (module.weight.dim() - 2)] = 0
        return _with_weight(module, input, module.weight * mask)


class SlowImpl(_TestImpl):
    name = "test_slow"
    class_prefix = "TestSlow"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        time.sleep(0.02)
        return _native(module, input)


COLD_S = 1.0


class ColdImpl(_TestImpl):
    name = "test_cold"
    class_prefix = "TestCold"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        if not getattr(module, "_test_cold_warm", False):
            time.sleep(COLD_S)
            module._test_cold_warm = True
        return _native(module, input)


class ThreadsImpl(_TestImpl):
    name = "test_threads"
    class_prefix = "TestThreads"

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_autocast_enabled("cpu", True)
        return _native(module, input)


TEST_IMPLS = (
    CrashImpl(),
    HangImpl(),
    OomImpl(),
    ProbeImpl(),
    LeakyImpl(),
    ScaledImpl(),
    TapImpl(),
    SlowImpl(),
    ColdImpl(),
    ThreadsImpl(),
)


def register_all() -> None:
    for impl in TEST_IMPLS:
        register(impl)


def unregister_all() -> None:
    """For tests that import this module in the test process: leave the registry as it was."""
    from advisor import impls

    for impl in TEST_IMPLS:
        impls._REGISTRY.pop(impl.name, None)


register_all()
