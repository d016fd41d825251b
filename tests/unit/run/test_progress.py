import pytest

from tracerl.run.metrics import Progress


def line(capsys: pytest.CaptureFixture[str], record: dict[str, float]) -> str:
    progress = Progress(total_steps=10, enabled=True)
    progress.update(3, record)
    return capsys.readouterr().err


def test_the_progress_line_shows_the_engines_generation_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a step trained on groups sampled earlier completed no new tokens, the engines did
    record = {"rollout/tokens_per_s": 0.0, "engine/generation_tokens_per_s": 812.4}
    assert "tok/s 812 " in line(capsys, record)
    # before the engines' first two polls: this step's own rollouts
    assert "tok/s 95 " in line(capsys, {"rollout/tokens_per_s": 95.2})
