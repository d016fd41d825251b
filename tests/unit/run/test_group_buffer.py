"""Which finished episodes become training groups."""

from __future__ import annotations

from tracerl.envs import EpisodeResult
from tracerl.run.rollouts import GroupBuffer, Rollout
from tracerl.train.batch import TrainSample


def rollout(group: int, reward: float | None, version: int = 0, failed: bool = False) -> Rollout:
    sample = TrainSample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], reward or 0.0, group, version)
    result = EpisodeResult(reward, failed=failed, reason="crashed" if failed else None)
    return Rollout(group, "train", result, [] if failed else [sample], 2, version)


def test_failed_episodes_are_dropped_and_thin_groups_with_them() -> None:
    buffer = GroupBuffer(group_size=3, filter_uniform=True)
    for r in (rollout(0, 1.0), rollout(0, None, failed=True), rollout(0, 0.0)):
        buffer.add(r)
    assert [len(g.rollouts) for g in buffer.ready] == [2]  # the failure never reaches training
    assert all(r.ok for r in buffer.ready[0].rollouts)
    for r in (rollout(1, 1.0), rollout(1, None, failed=True), rollout(1, None, failed=True)):
        buffer.add(r)
    assert len(buffer.ready) == 1  # one good episode is no baseline
    assert buffer.counters == {"episodes_failed": 3, "groups_dropped_failed": 1}


def test_uniform_groups_are_filtered_only_for_group_baselines() -> None:
    grpo, ppo = GroupBuffer(2, filter_uniform=True), GroupBuffer(2, filter_uniform=False)
    for buffer in (grpo, ppo):
        buffer.add(rollout(0, 1.0))
        buffer.add(rollout(0, 1.0))
    assert not grpo.ready and grpo.counters["groups_uniform"] == 1
    assert len(ppo.ready) == 1


def test_stale_groups_are_dropped_when_taken() -> None:
    buffer = GroupBuffer(2, filter_uniform=False)
    for group, version in ((0, 0), (1, 2), (2, 3)):
        buffer.add(rollout(group, 0.0, version))
        buffer.add(rollout(group, 1.0, version))
    assert buffer.fresh_ready(min_version=2) == 2
    taken = buffer.take(2, min_version=2)
    assert [g.group for g in taken] == [1, 2] and buffer.counters["groups_stale"] == 1
    for group, version in ((3, 1), (4, 4)):
        buffer.add(rollout(group, 0.0, version))
        buffer.add(rollout(group, 1.0, version))
    assert buffer.drop_stale(min_version=2) == 1
    assert [g.group for g in buffer.ready] == [4] and buffer.counters["groups_stale"] == 2


def test_cancelled_groups_stop_being_outstanding() -> None:
    buffer = GroupBuffer(2, filter_uniform=False)
    buffer.open(7)
    assert 7 in buffer.pending
    buffer.cancel(7)
    assert 7 not in buffer.pending and buffer.counters["groups_cancelled"] == 1
    buffer.add(rollout(7, 1.0))  # a member that finished after its group was shed
    assert 7 not in buffer.pending and not buffer.ready


def test_a_cancelled_group_is_forgotten_once_every_member_has_reported() -> None:
    buffer = GroupBuffer(3, filter_uniform=False)
    buffer.open(5)
    buffer.add(rollout(5, 1.0))  # finished before the shed
    buffer.cancel(5)  # one member shed
    buffer.add(rollout(5, 0.0))  # the last one finishes after: ignored
    assert not buffer.pending and not buffer.ready and not buffer._cancelled
    # the id is free again: nothing of group 5 lingers to swallow a later group's members
    buffer.add(rollout(5, 1.0))
    assert 5 in buffer.pending
    for group in range(100, 1100):  # shed groups do not accumulate
        buffer.open(group)
        buffer.cancel(group)
        buffer.cancel(group)
        buffer.add(rollout(group, 1.0))
    assert not buffer._cancelled and buffer.counters["groups_cancelled"] == 1001


def test_members_never_submitted_release_a_cancelled_group() -> None:
    buffer = GroupBuffer(4, filter_uniform=False)
    buffer.open(3)
    buffer.cancel(3)  # the first member shed while the feeder was submitting the second
    assert buffer.cancelled(3)
    buffer.add(rollout(3, 1.0))  # the second, submitted before the feeder noticed
    buffer.never_submitted(3, 2)  # the feeder stops: the last two never run
    assert not buffer.cancelled(3) and not buffer._cancelled and not buffer.pending
