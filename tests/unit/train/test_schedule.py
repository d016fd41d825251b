import math

import pytest
import torch

from tracerl.train.schedule import build_lr_schedule, lr_factor, optimizer_step

KINDS = ["constant", "linear", "cosine"]


def run(kind: str, steps: int, resume_at: int | None = None) -> list[float]:
    """Learning rates seen by `steps` updates, optionally stopping and resuming at `resume_at`."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=1e-3)
    sched = build_lr_schedule(opt, warmup_steps=3, total_steps=10, kind=kind, min_lr_ratio=0.1)
    rates = []
    for step in range(steps):
        if step == resume_at:
            state = {"opt": opt.state_dict(), "sched": sched.state_dict()}
            param = torch.nn.Parameter(param.detach().clone())
            opt = torch.optim.AdamW([param], lr=123.0)  # a fresh process, wrong initial rate
            sched = build_lr_schedule(
                opt, warmup_steps=3, total_steps=10, kind=kind, min_lr_ratio=0.1
            )
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
        rates.append(opt.param_groups[0]["lr"])
        param.sum().backward()
        optimizer_step(opt, sched, max_grad_norm=1.0)
    return rates


@pytest.mark.parametrize("kind", KINDS)
def test_resume_at_every_step_reproduces_the_schedule(kind: str) -> None:
    uninterrupted = run(kind, 14)
    for k in range(1, 14):
        assert run(kind, 14, resume_at=k) == uninterrupted, f"resumed at step {k}"


def test_schedule_shapes() -> None:
    # warmup 4 of 10 steps: 1/4, 2/4, 3/4, 4/4 of the rate, then decay to the floor 0.1 and hold
    f = [
        lr_factor(s, warmup_steps=4, total_steps=10, kind="linear", min_lr_ratio=0.1)
        for s in range(14)
    ]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert f[4] == 1.0 and f[7] == pytest.approx(0.1 + 0.9 * 0.5) and f[10:] == [0.1] * 4
    cos = [
        lr_factor(s, warmup_steps=0, total_steps=4, kind="cosine", min_lr_ratio=0.0)
        for s in range(6)
    ]
    assert cos[0] == 1.0 and cos[2] == pytest.approx(0.5) and cos[4:] == [0.0, 0.0]
    assert math.isclose(cos[1], 0.5 * (1 + math.cos(math.pi / 4)))


def test_unusable_gradients_skip_the_update_and_the_schedule() -> None:
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = build_lr_schedule(opt, warmup_steps=2, total_steps=5, kind="linear")
    (param.sum() * float("nan")).backward()
    out = optimizer_step(opt, sched, max_grad_norm=1.0)
    assert out["applied"] is False and sched.last_epoch == 0
    assert torch.equal(param.detach(), torch.ones(2)) and param.grad is None
    (param.sum() * 100).backward()
    out = optimizer_step(opt, sched, max_grad_norm=1.0, skip_grad_norm=10.0)
    assert out["applied"] is False and out["grad_norm"] > 10
    param.sum().backward()
    out = optimizer_step(opt, sched, max_grad_norm=1.0)
    assert out["applied"] is True and sched.last_epoch == 1
    assert not torch.equal(param.detach(), torch.ones(2))


def test_bad_schedule_arguments_name_the_argument() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup_steps: 5 exceeds total_steps 3"):
        build_lr_schedule(opt, warmup_steps=5, total_steps=3)
    with pytest.raises(ValueError, match="kind: expected"):
        build_lr_schedule(opt, warmup_steps=0, total_steps=3, kind="step")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_lr_ratio"):
        build_lr_schedule(opt, warmup_steps=0, total_steps=3, min_lr_ratio=2.0)
