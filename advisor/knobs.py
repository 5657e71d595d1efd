"""The knobs the advisor searches, and the one door through which PyTorch's global flags change.

`Settings` is what a config file records. `GlobalFlags` sets TF32 and cudnn.benchmark, remembers
the old values and restores them; the search and `apply` both go through it, so what was timed is
what is applied. Memory format, AMP and conv implementations act on the model and the step, not on
global state: `advisor.apply` handles those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from advisor.device import flags
from advisor.device.ops import cuda_ops

MemoryFormat = Literal["contiguous", "channels_last"]
Tf32 = Literal["off", "conv", "on"]
Amp = Literal["off", "fp16", "bf16"]
CpuFp32 = Literal["ieee", "bf16"]
CompileMode = Literal[
    "off", "default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"
]


class Settings(BaseModel):
    """One candidate configuration. The defaults are PyTorch's own defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_format: MemoryFormat = Field(
        "contiguous",
        description="channels_last means channels_last_3d for 5-D tensors (Conv3d).",
    )
    tf32: Tf32 = Field(
        "conv",
        description=(
            "off: fp32 everywhere; conv: TF32 for convs only, matmuls IEEE (PyTorch's default; "
            "the Triton and unfold+GEMM conv implementations compute in TF32 too, as the convs "
            "they replace); on: TF32 for convs and matmuls."
        ),
    )
    amp: Amp = Field("off", description="autocast dtype for the step; fp16 adds a GradScaler.")
    cpu_fp32: CpuFp32 = Field(
        "ieee",
        description=(
            "fp32 convs on a CPU: ieee (PyTorch's default) or bf16 (oneDNN computes them with "
            "bf16 products and fp32 sums: the CPU's TF32; CPUs with bf16 units only)."
        ),
    )
    cudnn_benchmark: bool = Field(False, description="cuDNN times its algorithms per shape")
    conv_impl: str = Field("native", description="implementation for conv layers not in `layers`")
    layers: dict[str, str] = Field(
        default_factory=dict, description="per-layer implementation: module name -> impl name"
    )
    compile: CompileMode = Field(
        "off",
        description="torch.compile's mode for the model, applied after the other settings "
        "(off: eager)",
    )
    compile_dynamic: bool | None = Field(
        None,
        description="torch.compile's `dynamic`: None is PyTorch's default (static, dynamic after "
        "a new shape); shape sets measure False (a graph per shape) against True (one graph)",
    )

    @field_validator("memory_format", mode="before")
    @classmethod
    def _alias_3d(cls, v: Any) -> Any:
        return "channels_last" if v == "channels_last_3d" else v

    def changes(self) -> dict[str, Any]:
        """The knobs that differ from PyTorch's defaults."""
        default = Settings()
        out = {k: v for k, v in self.model_dump().items() if v != getattr(default, k)}
        out.pop("layers", None)
        if any(impl != self.conv_impl for impl in self.layers.values()):
            out["layers"] = dict(self.layers)
        return out

    def global_only(self) -> Settings:
        """These settings with every conv layer on `native`: what a per-layer measurement of an
        implementation ran under."""
        return self.model_copy(update={"conv_impl": "native", "layers": {}})

    @property
    def compiled(self) -> bool:
        return self.compile != "off"

    def eager(self) -> Settings:
        """These settings without torch.compile: the eager model a compiled one is made from."""
        return self.model_copy(update={"compile": "off", "compile_dynamic": None})

    def graph(self) -> Settings:
        """What torch.compile's graph of these settings depends on: all but the CPU's fp32 conv
        precision, which oneDNN reads as each conv runs (Inductor calls convs as ATen kernels,
        and its caches key a graph without it). Two compiled candidates that differ only in it
        compile one graph: the first compile's artifacts serve the second."""
        return self.model_copy(update={"cpu_fp32": "ieee"})

    def label(self) -> str:
        """Short human label, e.g. 'channels_last+bf16' or 'default'."""
        parts = []
        for name, value in self.changes().items():
            if name == "layers":
                counts: dict[str, int] = {}
                for impl in value.values():
                    counts[impl] = counts.get(impl, 0) + 1
                parts.append("layers: " + ", ".join(f"{n}x {i}" for i, n in counts.items()))
            elif isinstance(value, bool):
                parts.append(f"{name}={'on' if value else 'off'}")
            else:
                parts.append(f"{name}={value}")
        return ", ".join(parts) or "default"


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[Any, ...]
    cuda_only: bool
    why: str  # what it changes, for `advisor env` and reports

    @property
    def default(self) -> Any:
        return Settings.model_fields[self.name].default

    def why_not(self, device: torch.device) -> str | None:
        if self.cuda_only and device.type != "cuda":
            return "CUDA only: no effect on CPU"
        if self.name == "cpu_fp32":
            return cpu_fp32_why_not(device)
        return None


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "memory_format",
            ("contiguous", "channels_last"),
            False,
            "NHWC/NDHWC layout for model and inputs; most convs prefer it under AMP",
        ),
        Knob("tf32", ("off", "conv", "on"), True, "TensorFloat-32 math on Ampere and later GPUs"),
        Knob("amp", ("off", "fp16", "bf16"), False, "autocast to half precision for the step"),
        Knob(
            "cpu_fp32",
            ("ieee", "bf16"),
            False,
            "oneDNN computes fp32 convs with bf16 units (fp32 sums): the CPU's TF32",
        ),
        Knob("cudnn_benchmark", (False, True), True, "let cuDNN time its algorithms per shape"),
        Knob("conv_impl", ("native",), False, "which implementation computes conv layers"),
        Knob(
            "compile",
            ("off", "default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"),
            False,
            "torch.compile the model (Inductor) in this mode, after the other settings",
        ),
    )
}
KNOB_NAMES: tuple[str, ...] = tuple(KNOBS)

# torch.compile's modes that mean something on each device: CUDA graphs are CUDA's alone, and on
# a CPU "max-autotune-no-cudagraphs" is "max-autotune".
_CUDA_GRAPH_MODES = ("max-autotune-no-cudagraphs", "reduce-overhead")


def compile_why_not(mode: str, device: torch.device) -> str | None:
    """Where a torch.compile mode cannot run or means nothing more than another one."""
    if device.type != "cuda" and mode in _CUDA_GRAPH_MODES:
        if mode == "reduce-overhead":
            return "CUDA graphs are CUDA only"
        return "max-autotune on a CPU: no CUDA graphs there"
    return None


def cpu_fp32_why_not(device: torch.device) -> str | None:
    """Where oneDNN's bf16 fp32 convs cannot run: on a GPU, on a torch without the setting, and
    on a CPU without bf16 units (oneDNN then ignores the setting: nothing to measure)."""
    from advisor.device.environment import cpu_has_bf16_units

    if device.type != "cpu":
        return "CPU only"
    if not flags.has_mkldnn_conv_precision():
        return "this torch has no oneDNN conv fp32_precision setting"
    if not cpu_has_bf16_units():
        return "this CPU has no bf16 units (avx512_bf16 or amx_bf16): oneDNN would ignore it"
    return None


_HALF = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def amp_why_not(
    amp: str, device: torch.device, param_dtype: torch.dtype = torch.float32
) -> str | None:
    """Where an autocast dtype cannot run or means nothing. fp16 runs on a CPU too (slowly; the
    built-in cpu space leaves it out, a space that lists it gets it, with its GradScaler, as on a
    GPU). Autocast to the parameters' own dtype changes nothing, and fp16 training's GradScaler
    cannot unscale fp16 gradients ("Attempting to unscale FP16 gradients")."""
    if amp == "bf16" and device.type == "cuda" and not cuda_ops().bf16_supported():
        return "this GPU has no bf16 support"
    if amp != "off" and _HALF.get(param_dtype) == amp:
        return f"the parameters are {amp} already: autocast to {amp} changes nothing"
    return None


def precision_of(
    settings: Settings, device: torch.device, dtype: torch.dtype = torch.float32
) -> str:
    """The numeric precision a candidate computes in: its tolerance class. `dtype` is the
    workload's own parameter dtype (a layer spec may be fp16 without autocast)."""
    if settings.amp != "off":
        return settings.amp
    if dtype in _HALF:
        return _HALF[dtype]
    if device.type == "cuda" and settings.tf32 != "off":
        return "tf32"
    if device.type == "cpu" and settings.cpu_fp32 == "bf16":
        return "bf16"  # bf16 products: the bf16 class of tolerances
    return "fp32"


class GlobalFlags:
    """Sets TF32 and cudnn.benchmark for a Settings, remembering the old values to restore.

    TF32 goes through `advisor.device.flags`: written with PyTorch's legacy setters, which keep
    the new `fp32_precision` values in step, so every reader works afterwards (`torch.compile`,
    Lightning); the saved state is put back exactly. On a CPU device TF32 is not applicable and
    its flags are left as they are.
    """

    def __init__(self) -> None:
        self._saved: dict[str, Any] | None = None

    read = staticmethod(flags.read_flags)
    write = staticmethod(flags.write_flags)

    @staticmethod
    def matmul_tf32() -> bool:
        """Whether TF32 is in force for fp32 matmuls (Triton's tl.dot follows it); never raises."""
        return flags.matmul_tf32()

    @staticmethod
    def conv_tf32() -> bool:
        """Whether TF32 is in force for fp32 convs: cuDNN's, and the conv implementations that
        replace them (Triton, unfold+GEMM), which follow this flag, not the matmul one."""
        return flags.conv_tf32()

    @staticmethod
    def wanted(settings: Settings, device: torch.device | None = None) -> dict[str, Any]:
        """The flags `settings` ask for (TF32 untouched on a CPU `device`)."""
        tf32 = None
        if device is None or device.type == "cuda":
            tf32 = {"conv": settings.tf32 in ("conv", "on"), "matmul": settings.tf32 == "on"}
        state: dict[str, Any] = {"tf32": tf32, "cudnn_benchmark": settings.cudnn_benchmark}
        if device is not None and device.type == "cpu" and cpu_fp32_why_not(device) is None:
            state["mkldnn_conv"] = settings.cpu_fp32
        return state

    def apply(self, settings: Settings, device: torch.device | None = None) -> None:
        if self._saved is None:
            self._saved = self.read()
        self.write(self.wanted(settings, device))

    @classmethod
    def switch_to(cls, settings: Settings, device: torch.device | None = None) -> None:
        """Set the flags for `settings` without saving: for switching between candidates that
        are each held by their own GlobalFlags (which restore the original state)."""
        cls.write(cls.wanted(settings, device))

    def restore(self) -> None:
        if self._saved is not None:
            if self.read() != self._saved:
                self.write(self._saved)
            self._saved = None

    def __enter__(self) -> GlobalFlags:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def memory_format_for(ndim: int, memory_format: str) -> torch.memory_format | None:
    """The torch memory format for a tensor of `ndim` dims, or None where it has no meaning."""
    if memory_format == "contiguous":
        return torch.contiguous_format
    if ndim == 4:
        return torch.channels_last
    if ndim == 5:
        return torch.channels_last_3d
    return None
