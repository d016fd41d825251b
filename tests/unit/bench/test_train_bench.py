import json

import pytest

from tracerl.bench.train import TARGET_LENGTH_RATIO, main, make_batch


def test_the_benchmark_batch_spans_ten_times_in_length() -> None:
    lengths = [len(s.token_ids) for s in make_batch(12, 20, seed=0, vocab=1000)]
    assert min(lengths) == 20 and max(lengths) == 20 * TARGET_LENGTH_RATIO
    assert len(set(lengths)) == 12


def test_the_benchmark_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "tiny", "--trajectories", "8", "--shortest", "8", "--rounds", "1"]
    assert main([*argv, "--threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["benchmark"] == "train" and result["batching"] == "bucket"
    assert result["tokens"] < result["padded_tokens"]
    assert isinstance(result["target_met"], bool)
    # both layouts computed the same first step from the same weights
    for batched, padded in result["first_step_losses_batched_padded"].values():
        assert batched == pytest.approx(padded, rel=1e-4, abs=1e-6)


def test_the_step_benchmark_compares_the_same_update(capsys: pytest.CaptureFixture[str]) -> None:
    from tracerl.bench import step

    assert step.main(["--model", "tiny", "--quick", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["benchmark"] == "step" and result["samples"] == 32
    assert len(result["trainer_step_s"]) == len(result["plain_step_s"]) == 1
    # both took the same AdamW step from the same weights and gradient
    assert result["update_rel_diff"] < 0.01
    assert isinstance(result["target_met"], bool)


def test_the_step_benchmark_times_autocast_beside_float32(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tracerl.bench import step

    assert step.main(["--model", "tiny", "--quick", "--threads", "1", "--autocast"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(result["trainer_autocast_step_s"]) == len(result["trainer_step_s"]) == 1
    assert result["float32_vs_autocast"] > 0
    # a different update (bfloat16 multiplies), of the same gradient's direction
    assert 0 < result["autocast_update_rel_diff"] < 1
