"""The optimizer updates written without torch.optim compute what torch.optim computes, a layer's
backward from its output gradients computes what its loss's computes, and an eager candidate's
steps and checks import neither torch._dynamo nor sympy."""

from __future__ import annotations

import copy
import textwrap

import torch
from torch import nn

from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.measure.updates import Adam, ZeroLrSgd
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from tests._cli import python_code


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))


def test_adam_matches_torch_optim_bit_for_bit() -> None:
    ours = _net().to(memory_format=torch.channels_last)
    theirs = copy.deepcopy(ours)
    a = Adam(list(ours.parameters()), lr=1e-2)
    b = torch.optim.Adam(theirs.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(12):
        x = torch.randn(4, 3, 16, 16, generator=gen)
        for model, opt in ((ours, a), (theirs, b)):
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
    moved = [not torch.equal(p, q) for p, q in zip(ours.parameters(), _net().parameters())]
    assert all(moved)  # the steps did update every parameter
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
        assert p.is_contiguous(memory_format=torch.channels_last) == q.is_contiguous(
            memory_format=torch.channels_last
        )


def test_adam_skips_a_parameter_without_gradient_and_zero_grad_can_keep_tensors() -> None:
    w, frozen = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    opt = Adam([w, frozen], lr=0.1)
    (w * torch.tensor([1.0, -2.0, 3.0])).sum().backward()
    opt.step()
    assert torch.allclose(w, torch.tensor([0.9, 1.1, 0.9]))  # Adam's first step: lr x sign
    assert torch.equal(frozen, torch.ones(3))
    opt.zero_grad(set_to_none=False)
    assert w.grad is not None and torch.equal(w.grad, torch.zeros(3))
    assert not Adam.handles([torch.zeros(2, dtype=torch.complex64)])


def test_zero_lr_sgd_runs_the_update_and_changes_nothing() -> None:
    model = _net()
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    ZeroLrSgd(list(model.parameters())).step()
    for p, q in zip(model.parameters(), before, strict=True):
        assert p.grad is not None and torch.equal(p, q)
    ZeroLrSgd([torch.zeros(2, requires_grad=True)]).step()  # no gradient yet: nothing to do


def test_eager_steps_and_checks_import_neither_dynamo_nor_sympy() -> None:
    # torch.optim's first use imports torch._dynamo (over a second of CPU per process);
    # torch.autograd.backward or .grad given gradients imports sympy (a fifth of a second).
    code = textwrap.dedent(
        """
        import sys, torch
        import advisor.examples.small_cnn as example
        from advisor.examples.small_cnn import build_model
        from advisor.gate.training import train
        from advisor.knobs import Settings
        from advisor.measure.candidate import Candidate
        from advisor.measure.verdict import PrecisionCheckSettings
        from advisor.workload.build import model_workload

        w = model_workload(example.__file__)
        for amp in ("bf16", "fp16"):  # fp16: its GradScaler steps through ZeroLrSgd too
            cand = Candidate(w, Settings(amp=amp), torch.device("cpu"), "train")
            for _ in range(2):
                cand.step()
            cand.close()
        args, kwargs = w.make_call(torch.device("cpu"), 0, 0)
        out = build_model()(*args)
        losses = train(w, Settings(), torch.device("cpu"), [(args, kwargs)],
                       [[torch.randn(out.shape)]], PrecisionCheckSettings(steps=2))
        assert len(losses) == 3 and all(l == l for l in losses), losses
        # a layer's step, and a candidate's layers checked alone, with their gradients
        from advisor.gate.numeric import Gate
        from advisor.space import load_space
        from advisor.workload.build import layer_workload
        from advisor.workload.layer_spec import layer_spec
        cpu = torch.device("cpu")
        spec = layer_spec("Conv2d(3, 4, 3)", input_shape="1,3,8,8")
        layer = Candidate(layer_workload(spec), Settings(), cpu, "train")
        layer.step()
        cand = Candidate(w, Settings(memory_format="channels_last"), cpu, "train")
        gate = Gate(w, cpu, "train", load_space("cpu", cpu))
        assert gate.check_layers(cand, cand.capture(record_convs=True).convs).ok
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
        """
    )
    r = python_code(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_a_grad_scaler_unscales_and_skips_through_zero_lr_sgd_as_through_torch_optim() -> None:
    # The timed fp16 step's GradScaler steps through ZeroLrSgd (no torch.optim, no import of
    # torch._dynamo): the same unscaled gradients, the same skipped step on an overflow.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    got: dict[str, list[torch.Tensor]] = {}
    for name in ("zero_lr_sgd", "torch_optim"):
        params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        opt = (ZeroLrSgd(params) if name == "zero_lr_sgd"
               else torch.optim.SGD(params, lr=0.0))  # fmt: skip
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        loss = torch.nn.functional.linear(x, params[0], params[1]).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)  # type: ignore[arg-type]
        scaler.update()
        assert scaler.get_scale() == 2.0**10  # finite gradients: the scale kept
        assert all(torch.equal(p, q) for p, q in zip(params, model.parameters(), strict=True))
        got[name] = [p.grad.clone() for p in params if p.grad is not None]
        params[0].grad.fill_(float("inf"))  # type: ignore[union-attr]
        scaler.step(opt)  # type: ignore[arg-type]
        scaler.update()
        assert scaler.get_scale() == 2.0**9  # an overflow: the step skipped, the scale backed off
    for a, b in zip(got["zero_lr_sgd"], got["torch_optim"], strict=True):
        assert torch.equal(a, b)  # unscaled alike


def test_a_layers_step_gives_the_gradients_of_its_loss_bit_for_bit() -> None:
    """A layer's timed step starts its backward at the engine's entry, from the output gradients
    its loss would give (`Candidate._backward_from_outputs`): the same gradients, bit for bit."""
    spec = layer_spec("Conv2d(4, 8, 3, padding=1, groups=2)", input_shape="2,4,9,9")
    cand = Candidate(layer_workload(spec), Settings(), torch.device("cpu"), "train")
    leaves = [*cand.tuned.module.parameters(), *cand.inputs]

    def grads() -> list[torch.Tensor]:
        got = [t.grad.clone() for t in leaves]  # type: ignore[union-attr]
        cand._zero_grad()
        return got

    cand.step()
    direct = grads()
    cand._loss(cand._forward()).backward()
    assert len(direct) == 3 and all(g.abs().sum() > 0 for g in direct)
    for a, b in zip(direct, grads(), strict=True):
        assert torch.equal(a, b)
    cand.close()
