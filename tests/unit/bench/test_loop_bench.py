from pathlib import Path

from tracerl.bench.loop import EMBEDDED_MODES, _embedded_config


def test_the_embedded_modes_are_the_learning_benchmarks_config_run_three_ways(
    tmp_path: Path,
) -> None:
    seen = set()
    for label, off_policy, engines in EMBEDDED_MODES:
        config = _embedded_config(tmp_path, 12, off_policy, engines)
        assert config.trainer.model == "smollm2-135m" and config.trainer.algorithm == "grpo"
        assert config.loop.steps == 12 and config.eval.every == 0
        assert config.orchestrator.batch_size == 32 and config.orchestrator.group_size == 8
        seen.add((config.loop.max_off_policy_steps, config.loop.engines_while_training))
        assert label.startswith("sync") == (off_policy == 0)
    assert seen == {(0, "pause"), (1, "pause"), (1, "run")}
