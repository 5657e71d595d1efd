"""Which layer groups the per-layer stage measures at default effort: those that carry the conv
work.

Each group measured costs a trial per qualifying implementation (building the layer, its first
call, timing, the layer's numeric check against float64: about a second each on a small CPU).
A group that holds a few per cent of the model's conv FLOPs cannot move the whole step by more
than that share, whatever its implementation, while it costs as much to measure as the largest.
So at default effort groups are measured largest first until `MAIN_SHARE` of the conv FLOPs
(forward and backward in train mode, times the layers in the group) is covered; the rest keep
PyTorch's native convolution, and the advice says so. Full effort measures every group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from advisor.measure.roofline import layer_cost
from advisor.workload.layer_spec import LayerSpec

__all__ = ["MAIN_SHARE", "MINOR", "main_groups", "minor_keys"]

MAIN_SHARE = 0.9
MINOR = (
    f"under {1 - MAIN_SHARE:.0%} of the model's conv work: kept native, not measured at default "
    "effort (--effort full measures every group)"
)


class _Group(Protocol):
    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def spec(self) -> LayerSpec: ...


class _Planned(_Group, Protocol):
    """A per-layer stage's group (`layer_groups.LayerGroup`)."""

    @property
    def key(self) -> str: ...

    @property
    def kept(self) -> str | None: ...


G = TypeVar("G", bound=_Group)


def group_flops(group: _Group, mode: str) -> int:
    """The conv FLOPs of every layer in the group, in `mode` (train counts the backward)."""
    flops, _ = layer_cost(group.spec.model_dump(mode="json"), mode, "fp32")
    return flops * len(group.names)


def main_groups(
    groups: Sequence[G], mode: str, share: float = MAIN_SHARE
) -> tuple[list[G], list[G]]:
    """The groups that carry `share` of the conv FLOPs, largest first, kept in their order; and
    the rest. A group whose cost cannot be computed is measured (never left out unseen)."""
    costs: dict[int, int | None] = {}
    for i, g in enumerate(groups):
        try:
            costs[i] = group_flops(g, mode)
        except Exception:  # noqa: BLE001 - e.g. a spec roofline cannot read: measure it
            costs[i] = None
    total = sum(c for c in costs.values() if c is not None)
    keep = {i for i, c in costs.items() if c is None}
    covered = 0
    for i in sorted((i for i, c in costs.items() if c is not None),
                    key=lambda i: -(costs[i] or 0)):  # fmt: skip
        if total and covered >= share * total:
            break
        keep.add(i)
        covered += costs[i] or 0
    return ([g for i, g in enumerate(groups) if i in keep],
            [g for i, g in enumerate(groups) if i not in keep])  # fmt: skip


def minor_keys(plan: Sequence[tuple[_Planned, list[str], dict[str, str]]], mode: str) -> set[str]:
    """The keys of the per-layer stage's measurable groups (not kept, more than one
    implementation) outside those that carry the conv work."""
    measurable = [g for g, usable, _ in plan if g.kept is None and len(usable) > 1]
    _, rest = main_groups(measurable, mode)
    return {g.key for g in rest}
