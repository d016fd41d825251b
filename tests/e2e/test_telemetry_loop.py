"""A training run on the `tiny` model with `[telemetry]` on: the OTLP/HTTP receiver gets a
`train.step` span per step with its phases as children, and every episode's trace (episode ->
gateway requests -> engine generations), all flushed when the run ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_train_loop import tiny_config
from tests.otlp import HttpReceiver
from tracerl.run.loop import RLLoop

pytestmark = pytest.mark.e2e


async def test_a_run_exports_its_steps_and_episodes(tmp_path: Path) -> None:
    async with HttpReceiver() as receiver:
        config = tiny_config("loop.steps=1", f"telemetry.otlp_endpoint={receiver.url}")
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        loop = RLLoop(config, run_dir)
        assert await loop.run() == 0  # its telemetry is flushed as it closes
        spans = list(receiver.spans)
    by_id = {s.span_id: s for s in spans}
    (step,) = [s for s in spans if s.name == "train.step"]
    assert step.parent_id is None and step.attributes["tracerl.step"] == 1
    assert step.attributes["tracerl.time.train_s"] > 0
    assert "tracerl.actor.policy_loss" in step.attributes
    phases = {s.name: s for s in spans if s.parent_id == step.span_id}
    assert set(phases) == {"train.wait_rollouts", "train.update", "weight_sync"}
    assert phases["weight_sync"].attributes["tracerl.weight_version"] == 1
    for phase in phases.values():
        assert step.start_ns <= phase.start_ns <= phase.end_ns <= step.end_ns
    episodes = [s for s in spans if s.name == "episode"]
    assert len(episodes) >= config.orchestrator.batch_size
    assert all(
        e.parent_id is None and e.attributes["tracerl.env.name"] == "concise" for e in episodes
    )
    requests = [s for s in spans if s.name == "gateway.request"]
    generations = [s for s in spans if s.name == "engine.generate"]
    assert requests and generations
    # every request hangs below an episode of its trace, every generation below a request
    for request in requests:
        parent = by_id[str(request.parent_id)]
        assert parent.name == "episode" and parent.trace_id == request.trace_id
        assert request.attributes["tracerl.session.id"] == parent.attributes["tracerl.session.id"]
    for generation in generations:
        assert by_id[str(generation.parent_id)].name == "gateway.request"
    # an episode either ended (its outcome recorded) or was cancelled as the run stopped
    ended = [e for e in episodes if not e.attributes.get("tracerl.cancelled")]
    assert len(ended) >= config.orchestrator.batch_size
    for episode in ended:
        assert episode.attributes["tracerl.episode.failed"] is (episode.status == "ERROR")
        assert "tracerl.episode.reward" in episode.attributes or episode.status == "ERROR"
    for episode in episodes:
        if episode.attributes.get("tracerl.cancelled"):
            assert episode.status == "UNSET"  # shed or stopped: not a failure
