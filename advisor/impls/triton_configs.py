"""The Triton conv kernels' tile configurations, and which of them a layer is worth autotuning.

Plain Python (no triton import): the kernel module builds `triton.Config`s from these tiles and
hands the pruners to `triton.autotune(prune_configs_by={"early_config_prune": ...})`, which calls
one with (configs, named_args, **constexpr kwargs) once per new autotune key, before compiling and
benchmarking what it returns (triton/runtime/autotuner.py, `Autotuner.prune_configs`, the same
in Triton 3.6 and 3.9). Every config kept costs a compile and about 125 ms of benchmarking (25 ms
warm-up + 100 ms in `do_bench`), so a tile wider than the layer needs is dropped: it only adds
masked-off lanes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# tl.dot's tiles: the kernels' configs start at 16, and K >= 16 is Triton 3.6's least dot depth
# for 16- and 32-bit inputs (backends/nvidia/compiler.py, min_dot_size).
MIN_DOT = 16

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
Tile = tuple[int, int, int, int, int]
GEMM_TILES: list[Tile] = [
    (128, 128, 32, 8, 3),
    (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4),
    (64, 64, 32, 4, 4),
    (128, 32, 32, 4, 4),
    (128, 16, 16, 4, 3),  # few output channels (RGB stems, small groups)
    (64, 32, 16, 2, 3),
]
WGRAD_TILES: list[Tile] = [
    (64, 64, 64, 4, 3),
    (128, 64, 32, 8, 3),
    (64, 128, 32, 8, 3),
    (32, 32, 64, 4, 4),
    (16, 16, 128, 4, 3),  # few channels: long reductions over positions
]

Pruner = Callable[..., list[Any]]


def tile_need(size: int) -> int:
    """The widest tile worth using along a dimension of `size`: the power of two covering it,
    at least MIN_DOT."""
    return max(MIN_DOT, 1 << max(size - 1, 0).bit_length())


def fitting(configs: Sequence[Any], sizes: dict[str, int]) -> list[Any]:
    """The configs (anything with `.kwargs`, e.g. triton.Config) whose BLOCK_* are no wider than
    `sizes` need; along a block where none is, those with its narrowest tile. Never empty."""
    kept = list(configs)
    for block, size in sizes.items():
        fit = [c for c in kept if c.kwargs[block] <= tile_need(size)]
        if not fit:
            least = min(c.kwargs[block] for c in kept)
            fit = [c for c in kept if c.kwargs[block] == least]
        kept = fit
    return kept


def gemm_pruner(n: str, k: str) -> Pruner:
    """For the forward / grad-input kernels: BLOCK_M over positions M, BLOCK_N over the channels
    named `n`, BLOCK_K over the reduction channels named `k` (CGO/CGI, swapped in grad-input)."""

    def prune(configs: list[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
        sizes = {"BLOCK_K": named_args[k], "BLOCK_N": named_args[n], "BLOCK_M": named_args["M"]}
        return fitting(configs, sizes)

    return prune


def prune_wgrad(configs: list[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
    """For the grad-weight kernel: BLOCK_M over CGO, BLOCK_N over CGI, BLOCK_K over one split's
    share of the output positions P."""
    split = max(1, int(named_args["SPLIT"]))
    share = -(-int(named_args["P"]) // split)
    sizes = {"BLOCK_M": named_args["CGO"], "BLOCK_N": named_args["CGI"], "BLOCK_K": share}
    return fitting(configs, sizes)


def too_thin(in_channels: int, out_channels: int, groups: int) -> str | None:
    """Why a grouped layer's groups are too thin for the dot tiles (depthwise and near it: fewer
    than MIN_DOT channels per group in and out), else None. An ungrouped layer that thin (a toy
    3 -> 4) is still tried: pruned to one config, it costs one compile."""
    in_per_group, out_per_group = in_channels // groups, out_channels // groups
    if groups == 1 or in_per_group >= MIN_DOT or out_per_group >= MIN_DOT:
        return None
    useful = in_per_group * out_per_group / MIN_DOT**2
    return (
        f"{in_per_group} input and {out_per_group} output channels per group (depthwise-like): "
        f"the kernels' {MIN_DOT}x{MIN_DOT} dot tiles over channels would be {useful:.1%} useful "
        "work, after a compile and autotune per shape; native's depthwise kernels are the better "
        "bet"
    )
