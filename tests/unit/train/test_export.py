"""`tracerl export RUN_DIR OUT [--step N]`: a checkpoint's actor as a Hugging Face directory that
transformers loads as the trained model, with its tokenizer and chat template; bad input is a
one-line error (exit 2) that writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.unit.train.conftest import make_samples
from tracerl.cli.main import main
from tracerl.train.trainer import Trainer


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_export_writes_the_checkpointed_actor_of_the_step_asked(
    make_trainer: Callable[..., Trainer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = make_trainer(algorithm="ppo")  # a critic and two optimizers in the checkpoint
    checkpoints = tmp_path / "run" / "checkpoints"
    saved: dict[int, dict[str, torch.Tensor]] = {}
    for step in (1, 2):
        trainer.step(make_samples(step))
        trainer.save_checkpoint(checkpoints)
        saved[step] = weights(trainer.actor)
    assert saved[1].keys() == saved[2].keys()
    assert any(not torch.equal(saved[1][n], saved[2][n]) for n in saved[1])

    for step, args in ((1, ["--step", "1"]), (2, [])):  # no --step: the newest
        out = tmp_path / f"export-{step}"
        assert main(["export", str(tmp_path / "run"), str(out), *args]) == 0
        assert capsys.readouterr().out.strip() == str(out)
        model = AutoModelForCausalLM.from_pretrained(out)
        assert weights(model).keys() == saved[step].keys()
        for name, tensor in weights(model).items():
            assert torch.equal(tensor, saved[step][name]), name
        assert not list(out.glob("*optim*")) and not (out / "critic").exists()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export-2")
    assert tokenizer.chat_template == trainer.tokenizer.chat_template
    assert tokenizer("a test")["input_ids"] == trainer.tokenizer("a test")["input_ids"]


def test_bad_export_requests_fail_in_one_line_and_write_nothing(
    make_trainer: Callable[..., Trainer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith(f"tracerl: RUN_DIR: {run} has no checkpoints")

    trainer = make_trainer()
    trainer.step(make_samples(0))
    path = trainer.save_checkpoint(run / "checkpoints")
    assert main(["export", str(run), str(tmp_path / "out"), "--step", "7"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"tracerl: --step: {run} has no checkpoint of step 7 (it has 1)"
    )
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("mine")
    assert main(["export", str(run), str(taken)]) == 2
    assert "OUT: " in capsys.readouterr().err and (taken / "file").read_text() == "mine"

    shard = next((path / "model").glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # its last byte changed: corrupt
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    assert "does not match its manifest" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
