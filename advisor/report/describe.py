"""`advisor show` and `advisor env`: a config and this machine, in words."""

from __future__ import annotations

from typing import Any

import torch

from advisor import impls
from advisor.config import load_config
from advisor.device.environment import current_environment, resolve_device
from advisor.impls.triton_loader import interpreting
from advisor.knobs import KNOBS, amp_why_not, compile_why_not


def describe_config(path: str) -> str:
    cfg = load_config(path)
    s = cfg.settings
    lines = [
        f"Config {path} (schema {cfg.schema_version}, advisor {cfg.advisor_version}, {cfg.created})",
        f"Workload: {cfg.workload.get('description', cfg.workload.get('target', '?'))} [{cfg.mode}]",
        "Settings:",
        f"  memory_format   {s.memory_format}",
        f"  tf32            {s.tf32}",
        f"  amp             {s.amp}",
        f"  cudnn_benchmark {s.cudnn_benchmark}",
        f"  conv_impl       {s.conv_impl}",
        f"  compile         {s.compile}"
        + (f" (dynamic={s.compile_dynamic})" if s.compile_dynamic is not None else ""),
    ]
    for name, impl in s.layers.items():
        lines.append(f"    {name}: {impl}")
    lines.append(f"  changes from PyTorch's default: {s.label()}")
    lines += _unknown_impls(s.conv_impl, s.layers)
    r = cfg.result
    if r is not None:
        lines += [
            "Result:",
            f"  default   {r.baseline.median_ms:.3f} ms [{r.baseline.ci_low_ms:.3f}, {r.baseline.ci_high_ms:.3f}]",
            f"  tuned     {r.tuned.median_ms:.3f} ms [{r.tuned.ci_low_ms:.3f}, {r.tuned.ci_high_ms:.3f}]",
            f"  speedup   {r.speedup:.2f}x [{r.speedup_ci[0]:.2f}, {r.speedup_ci[1]:.2f}]",
            f"  error     {r.rel_error:.1e} ({r.precision}, tolerance {r.tolerance:.0e})",
            f"  why       {r.why}",
            *([f"  cudnn.benchmark: {r.benchmark_note}"] if r.benchmark_note else []),
            *([f"  torch.compile: {r.compile_note}"] if r.compile_note else []),
            *([f"  final check: {r.final_check.summary()}"] if r.final_check else []),
            *[f"  warning   {w}" for w in r.warnings],
            f"  trials    {r.trials} ({r.rejected} rejected, {r.failed} failed) in {r.tuning_s:.0f} s",
        ]
    env = cfg.environment
    lines.append(
        f"Tuned on: {env.device_name} ({env.device_type}), torch {env.torch}, "
        f"fingerprint {env.fingerprint}"
    )
    try:
        here = current_environment(env.device_type)
    except Exception:  # noqa: BLE001 - e.g. a CUDA config on a CPU machine
        lines.append(f"This machine: no {env.device_type} device: the config does not match")
    else:
        diffs = here.mismatches(env)  # recomputed here and compared field by field
        lines.append(
            "This machine: matches"
            if not diffs
            else "This machine: differs (" + "; ".join(diffs) + "): re-tune for best results"
        )
    return "\n".join(lines)


def _unknown_impls(conv_impl: str, layers: dict[str, str]) -> list[str]:
    """A line per implementation the config names that is not registered here (a plugin not
    installed, a typo): `advisor.apply` runs those layers with native."""
    known = impls.names()
    named: dict[str, list[str]] = {}
    if conv_impl not in known:
        named.setdefault(conv_impl, []).append("conv_impl")
    for layer, impl in layers.items():
        if impl not in known:
            named.setdefault(impl, []).append(f"layer {layer!r}")
    return [
        f"  unknown implementation here: {impl!r} ({', '.join(where[:5])}"
        f"{', ...' if len(where) > 5 else ''}): advisor.apply uses native for it; "
        f"known: {', '.join(known)}"
        for impl, where in named.items()
    ]


def env_dict(device: str = "auto") -> dict[str, Any]:
    dev = resolve_device(device)
    env = current_environment(dev)
    knobs = {}
    for name, knob in KNOBS.items():
        if name == "conv_impl":
            continue
        why = knob.why_not(dev)
        values = {}
        for v in knob.values:
            reason = why or (amp_why_not(v, dev) if name == "amp" else None)
            reason = reason or (compile_why_not(v, dev) if name == "compile" else None)
            values[str(v)] = reason or "applies"
        knobs[name] = values
    probe = torch.nn.Conv2d(8, 8, 3)
    impl_status = {}
    for name in impls.names():
        reason = impls.why_not(name, probe, device=dev, dtype=torch.float32)
        impl_status[name] = {
            "description": impls.get_impl(name).description,
            "Conv2d(8, 8, 3) fp32": reason or "applies",
        }
    return {
        "environment": env.model_dump(mode="json"),
        "knobs": knobs,
        "implementations": impl_status,
        "triton_interpreter": interpreting(),
    }


def describe_env(device: str = "auto") -> str:
    d = env_dict(device)
    env = d["environment"]
    lines = [f"Device:      {env['device_name']} ({env['device_type']})"]
    for key, value in env.items():  # every field of Environment, in its order
        if key not in ("device_type", "device_name") and value is not None:
            lines.append(f"{key + ':':<13}{value}")
    lines.append("Knobs:")
    for name, values in d["knobs"].items():
        lines.append(
            f"  {name}: "
            + ", ".join(f"{v} ({why})" if why != "applies" else v for v, why in values.items())
        )
    lines.append("Implementations (checked on a Conv2d(8, 8, 3), fp32):")
    for name, info in d["implementations"].items():
        status = info["Conv2d(8, 8, 3) fp32"]
        lines.append(
            f"  {name:<17}{'applies' if status == 'applies' else 'n/a: ' + status}"
            f"  - {info['description']}"
        )
    return "\n".join(lines)
