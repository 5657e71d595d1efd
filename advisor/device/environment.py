"""Which machine and library versions we are on, and a fingerprint that tells two apart."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from advisor.device.ops import cuda_ops
from advisor.errors import DeviceError


def cache_dir() -> Path:
    """The advisor's cache folder: $ADVISOR_CACHE_DIR, else $XDG_CACHE_HOME/conv-advisor, else
    ~/.cache/conv-advisor (stored studies)."""
    if "ADVISOR_CACHE_DIR" in os.environ:
        return Path(os.environ["ADVISOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "conv-advisor"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' (or None) -> CUDA when available, else CPU; anything else must exist here."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if cuda_ops().is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {device!r}; use auto, cpu or cuda[:N]") from None
    if dev.type == "cuda":
        ops = cuda_ops()
        if not ops.is_available():
            raise DeviceError(f"device {device!r} asked for, but CUDA is not available here")
        if dev.index is not None and dev.index >= ops.device_count():
            raise DeviceError(
                f"device {device!r} does not exist: {ops.device_count()} CUDA device(s)"
            )
    elif dev.type != "cpu":
        raise DeviceError(f"unsupported device {device!r}; use auto, cpu or cuda[:N]")
    return dev


class Environment(BaseModel):
    """What a measurement depends on. Configs record it; apply() compares fingerprints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device_type: str
    device_name: str
    capability: str | None = None
    device_memory_gb: float | None = None
    cpu_threads: int
    torch: str
    cuda: str | None = None
    cudnn: str | None = None
    triton: str | None = None
    driver: str | None = None
    python: str
    platform: str
    fingerprint: str

    def differences(self, other: Environment) -> list[str]:
        """Fields (of those in the fingerprint) that differ, as 'name: ours vs theirs'."""
        out = []
        for name in _FINGERPRINT_FIELDS:
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                out.append(f"{name}: {a} vs {b}")
        return out

    def fingerprint_of_fields(self) -> str:
        """The fingerprint these fields give (a stored `fingerprint` may have been edited)."""
        return _fingerprint({k: getattr(self, k) for k in _FINGERPRINT_FIELDS})

    def mismatches(self, recorded: Environment) -> list[str]:
        """Why a config `recorded` in another environment does not match this one (empty: it
        matches). Compares the fields, not the stored fingerprint alone, and says when the stored
        fingerprint is not the one its fields give (an edited file)."""
        out = self.differences(recorded)
        own = recorded.fingerprint_of_fields()
        if recorded.fingerprint != own:
            out.append(
                f"fingerprint: the config's {recorded.fingerprint} is not the one its fields "
                f"give ({own}): edited by hand?"
            )
        elif not out and recorded.fingerprint != self.fingerprint:
            out.append(f"fingerprint: {self.fingerprint} vs {recorded.fingerprint}")
        return out


# What decides which configuration is fastest: the hardware and the kernel libraries.
_FINGERPRINT_FIELDS = (
    "device_type",
    "device_name",
    "capability",
    "cpu_threads",
    "torch",
    "cuda",
    "cudnn",
    "triton",
    "driver",
)


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpuinfo_field(name: str) -> str | None:
    """The first `name` line of /proc/cpuinfo (Linux), or None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# CPU features that decide whether bf16/fp16 autocast and oneDNN's low-precision kernels are fast:
# a virtual machine often names every AMD or Intel CPU alike ("AMD EPYC"), while one has bf16 dot
# products (where bf16 autocast can win) and another emulates them (bf16 3-20x slower).
_CPU_FLAGS = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_int8", "avx512_vnni")


# oneDNN's instruction sets (`ONEDNN_MAX_CPU_ISA`, read once, at its first use) below
# AVX512_CORE_BF16: capped at one of them, oneDNN leaves the CPU's bf16 units unused, so its bf16
# convs run as on a CPU without them. Every other cap (AMX, AVX10, ALL) keeps them.
_ONEDNN_BELOW_BF16 = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
)


def onednn_isa_cap() -> str | None:
    """The instruction set oneDNN is capped at in this process's environment
    (`ONEDNN_MAX_CPU_ISA`, or its older name `DNNL_MAX_CPU_ISA`), upper-cased; None where
    uncapped."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        cap = os.environ.get(name, "").strip().upper()
        if cap:
            return None if cap in ("ALL", "DEFAULT") else cap
    return None


def cpu_has_bf16_units() -> bool:
    """Whether this CPU computes bf16 products in hardware (AVX-512 BF16 or AMX) and oneDNN may
    use them (`onednn_isa_cap`): where bf16 autocast and oneDNN's bf16 fp32 convs can be fast,
    not emulated."""
    have = set((_cpuinfo_field("flags") or "").split())
    cap = onednn_isa_cap()
    return bool(have & {"avx512_bf16", "amx_bf16"}) and cap not in _ONEDNN_BELOW_BF16


def cpu_bf16_kernels(device: torch.device) -> bool | None:
    """Whether bf16 convs run oneDNN's bf16 kernels on this CPU: PyTorch's own check (AVX-512 or
    bf16 units) and oneDNN not capped below them (`onednn_isa_cap`: up to AVX2_VNNI it has none);
    elsewhere they run reference kernels. None off the CPU."""
    if device.type != "cpu":
        return None
    supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return supported and onednn_isa_cap() not in _ONEDNN_BELOW_BF16[:4]


def _cpu_capability() -> str:
    """The vector ISA PyTorch dispatches to (AVX2, AVX512, ...), the low-precision features and
    oneDNN's cap where one is set (a capped run is another machine's measurement)."""
    isa = torch.backends.cpu.get_cpu_capability()
    have = set((_cpuinfo_field("flags") or "").split())
    cap = onednn_isa_cap()
    return " ".join(
        [isa, *(f for f in _CPU_FLAGS if f in have), *([f"onednn<={cap}"] if cap else [])]
    )


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        if word[:1].isdigit() and word.count(".") >= 1:
            return word
    return None


@lru_cache(maxsize=8)
def _environment(device_type: str, index: int, threads: int) -> Environment:
    fields: dict[str, object] = {
        "device_type": device_type,
        "cpu_threads": threads,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _package_version("triton"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    if device_type == "cuda":
        props = cuda_ops().properties(index)
        fields["device_name"] = props.name
        fields["capability"] = f"{props.major}.{props.minor}"
        fields["device_memory_gb"] = round(props.total_memory / 2**30, 1)
        cudnn = cuda_ops().cudnn_version()
        fields["cudnn"] = str(cudnn) if cudnn else None
        fields["driver"] = _nvidia_driver()
    else:
        fields["device_name"] = (
            _cpuinfo_field("model name") or platform.processor() or platform.machine()
        )
        fields["capability"] = _cpu_capability()
        fields["cudnn"] = None
    fields["fingerprint"] = _fingerprint(fields)
    return Environment(**fields)


def _fingerprint(fields: Mapping[str, object]) -> str:
    key = "|".join(f"{k}={fields.get(k)}" for k in _FINGERPRINT_FIELDS)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def current_environment(device: str | torch.device | None = "auto") -> Environment:
    dev = resolve_device(device)
    index = cuda_ops().index_of(dev) if dev.type == "cuda" else 0
    # The thread count is part of the key: a process that changed it is another environment.
    return _environment(dev.type, index, torch.get_num_threads())


def memory_limit(device: str | torch.device) -> tuple[int, str] | None:
    """(bytes, what) that one tensor on `device` can never exceed here: the machine's total RAM
    on a CPU, the device's total memory on CUDA; None where it cannot be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        ops = cuda_ops()
        if not ops.is_available():
            return None
        props = ops.properties(ops.index_of(dev))
        return int(props.total_memory), f"memory of {props.name}"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None
    return (int(total), "RAM") if total > 0 else None
