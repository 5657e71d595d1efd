import math

import torch

from advisor.gate.metrics import global_rel_error, max_rel_error, rel_error


def test_rel_error_basics() -> None:
    a = torch.randn(100)
    assert rel_error(a, a) == 0.0
    assert abs(rel_error(a * 1.01, a) - 0.01) < 1e-6
    assert math.isinf(rel_error(torch.full((3,), float("nan")), torch.ones(3)))
    assert math.isinf(rel_error(torch.tensor([float("inf"), 1.0]), torch.ones(2)))
    assert math.isinf(rel_error(torch.ones(3), torch.ones(4)))


def test_max_and_global_errors() -> None:
    ref = {"w": torch.randn(50), "b": torch.full((3,), 1e-9)}
    out = {"w": ref["w"].clone(), "b": torch.full((3,), 2e-9)}
    # per-tensor: the near-zero bias dominates; globally it is negligible
    assert max_rel_error(out, ref) > 0.9
    assert global_rel_error(out, ref) < 1e-6
    assert math.isinf(global_rel_error({"w": ref["w"]}, ref))
    assert max_rel_error([torch.ones(2)], [torch.ones(2)]) == 0.0
