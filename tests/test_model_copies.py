"""A model file's model is built once per process and copied after: the same weights, an
independent model each time, and a build every time where a copy could differ."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from advisor.workload.build import model_workload
from advisor.workload.copying import closure_in, copying_factory

HEADER = """
import torch
from torch import nn

def _count_build():
    with open(__file__ + ".builds", "a") as f:
        f.write("x")

def example_inputs():
    return (torch.randn(2, 3, 8, 8),)
"""


def _file(tmp_path: Path, body: str) -> str:
    f = tmp_path / "model.py"
    f.write_text(textwrap.dedent(HEADER) + textwrap.dedent(body))
    return str(f)


def test_copies_have_the_built_weights_and_are_independent(tmp_path) -> None:
    made: list[torch.nn.Module] = []

    def build() -> torch.nn.Module:
        made.append(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)))
        return made[-1]

    make = copying_factory(build)
    a, b = make(), make()
    assert len(made) == 1  # built once, then copied
    assert a is not made[0] and b is not made[0] and a is not b
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
    with torch.no_grad():
        a[0].weight.add_(1.0)  # a candidate's changes stay its own
    a.train()(torch.randn(2, 3, 8, 8))  # and so do its running statistics
    c = make()
    assert torch.equal(c[0].weight, made[0][0].weight)
    assert torch.equal(c[1].running_mean, torch.zeros(4))


def test_a_model_with_a_closure_hook_is_built_every_time(tmp_path) -> None:
    # A hook closing over the model's own layer: a copy's hook would still scale the
    # original's layer, so a copy would not be the model the file builds.
    path = _file(tmp_path, """
        def build_model():
            _count_build()
            m = nn.Sequential(nn.Conv2d(3, 4, 3))
            conv = m[0]
            m.register_forward_hook(lambda mod, inp, out: out * conv.weight.abs().mean())
            return m
    """)
    w = model_workload(path)
    loaded = len(Path(path + ".builds").read_text())
    a, b = w.make_model(), w.make_model()
    assert closure_in(a) is not None
    assert len(Path(path + ".builds").read_text()) == loaded + 2
    with torch.no_grad():
        a[0].weight.mul_(2.0)
    x = torch.randn(1, 3, 8, 8)
    # each model's hook reads its own layer: b is untouched by a's change
    for m in (a, b):
        assert torch.allclose(m(x), m[0](x) * m[0].weight.abs().mean())
    assert not torch.allclose(a(x), b(x))


def test_a_model_deepcopy_refuses_is_built_every_time() -> None:
    import threading

    made = []

    class Locked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.lock = threading.Lock()  # deepcopy cannot copy a lock

    def build() -> torch.nn.Module:
        made.append(Locked())
        return made[-1]

    make = copying_factory(build)
    models = [make() for _ in range(3)]
    assert len(made) == 3 and len({id(m) for m in models}) == 3
    assert models[0] is made[0]  # the first build is handed out, not built twice


def test_a_model_file_is_built_once_per_workload(tmp_path) -> None:
    path = _file(tmp_path, """
        def build_model():
            _count_build()
            return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    """)
    w = model_workload(path)
    loaded = len(Path(path + ".builds").read_text())  # the load's own build(s)
    first = [p.detach().clone() for p in w.make_model().parameters()]
    for _ in range(3):
        again = [p.detach() for p in w.make_model().parameters()]
        assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
    assert len(Path(path + ".builds").read_text()) == loaded + 1  # four models, one build


def test_the_weights_are_held_once_and_stay_the_built_ones(tmp_path) -> None:
    path = _file(tmp_path, """
        def build_model():
            _count_build()
            return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    """)
    w = model_workload(path)
    a = w.make_model()
    before = [p.detach().clone() for p in a.parameters()]
    with torch.no_grad():  # a candidate changes its weights and statistics in place
        for p in a.parameters():
            p.add_(1.0)
    a.train()(torch.randn(2, 3, 8, 8))
    b = w.make_model()
    assert all(torch.equal(x, y) for x, y in zip(before, b.parameters(), strict=True))
    assert torch.equal(b[1].running_mean, torch.zeros(4))


def test_a_model_file_deepcopy_refuses_keeps_its_weights(tmp_path) -> None:
    path = _file(tmp_path, """
        import threading

        class Locked(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3)
                self.lock = threading.Lock()  # deepcopy cannot copy a lock

            def forward(self, x):
                return self.conv(x)

        def build_model():
            return Locked()
    """)
    w = model_workload(path)
    a = w.make_model()
    before = a.conv.weight.detach().clone()
    with torch.no_grad():
        a.conv.weight.add_(1.0)
    assert torch.equal(w.make_model().conv.weight, before)
