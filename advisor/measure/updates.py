"""Optimizer updates without `torch.optim`, for the timed step and the training check.

`torch.optim`'s first use (an optimizer's construction) imports `torch._dynamo`: over a second of
CPU, paid by every process that times or checks a candidate, on the path to the first answer. An
eager run without a GradScaler needs nothing from it, so these are the same updates written with the
same tensor ops (`torch.optim`'s single-tensor paths, the CPU's default):

- `ZeroLrSgd`: plain SGD at learning rate 0, the timed step's update (its kernels run; no weight
  changes, so every step and the numeric gate see the same model). On a GPU, as
  `torch.optim.SGD` does there, one `_foreach_add_` over the parameters.
- `Adam`: Adam with PyTorch's defaults (betas 0.9 and 0.999, eps 1e-8, no weight decay, no
  amsgrad), the training check's optimizer, step for step what `torch.optim.Adam` computes.

A GradScaler reads an optimizer's `param_groups` (to unscale their gradients) and calls its
`step()` (skipped after an overflow), nothing else: `ZeroLrSgd` has both, so the timed fp16 step
does not import `torch._dynamo` either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Adam", "ZeroLrSgd"]


class ZeroLrSgd:
    """`torch.optim.SGD(params, lr=0.0).step()`: each parameter plus -0 x its gradient."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.param_groups = [{"params": self.params}]  # what a GradScaler unscales

    def step(self) -> None:
        with torch.no_grad():
            pairs = [(p, p.grad) for p in self.params if p.grad is not None]
            if not pairs:
                return
            if all(p.device.type == "cuda" for p, _ in pairs):
                torch._foreach_add_([p for p, _ in pairs], [g for _, g in pairs], alpha=-0.0)
                return
            for p, g in pairs:
                p.add_(g, alpha=-0.0)


class Adam:
    """`torch.optim.Adam(params, lr=lr)`'s single-tensor step, for real floating parameters."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float) -> None:
        self.params, self.lr = list(params), lr
        self.beta1, self.beta2, self.eps = 0.9, 0.999, 1e-8
        self._state: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._steps: dict[int, int] = {}

    @staticmethod
    def handles(params: Sequence[torch.Tensor]) -> bool:
        """Whether this class computes these parameters' updates (complex ones: torch.optim)."""
        return all(p.is_floating_point() for p in params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def step(self) -> None:
        b1, b2 = self.beta1, self.beta2
        with torch.no_grad():
            for i, p in enumerate(self.params):
                g = p.grad
                if g is None:
                    continue
                if i not in self._state:
                    self._state[i] = (
                        torch.zeros_like(p, memory_format=torch.preserve_format),
                        torch.zeros_like(p, memory_format=torch.preserve_format),
                    )
                    self._steps[i] = 0
                exp_avg, exp_avg_sq = self._state[i]
                self._steps[i] += 1
                step = float(self._steps[i])
                exp_avg.lerp_(g, 1 - b1)
                exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
                step_size = self.lr / (1 - b1**step)
                denom = (exp_avg_sq.sqrt() / (1 - b2**step) ** 0.5).add_(self.eps)
                p.addcdiv_(exp_avg, denom, value=-step_size)
