from dataclasses import replace

import pytest

from tracerl.train.shard import Shard, ShardError

from .conftest import make_samples


def test_ranks_split_whole_groups_balanced_by_tokens() -> None:
    samples = make_samples(3, count=12, group_size=3)  # 4 groups
    shards = [Shard.split(samples, rank, 2) for rank in range(2)]
    owned = [set(s.owned) for s in shards]
    assert owned[0] | owned[1] == set(range(12)) and not owned[0] & owned[1]
    for shard in shards:  # whole groups: a group's prompt is forwarded once, on one rank
        groups = {samples[i].group_id for i in shard.owned}
        assert {i for i, s in enumerate(samples) if s.group_id in groups} == set(shard.owned)
    tokens = [sum(len(samples[i].token_ids) for i in s.owned) for s in shards]
    group_tokens = [sum(len(s.token_ids) for s in samples if s.group_id == g) for g in range(4)]
    assert abs(tokens[0] - tokens[1]) <= max(group_tokens)
    assert Shard.split(samples, 0, 1).owned == list(range(12))


def test_fewer_groups_than_ranks_split_by_sample_and_too_few_samples_fail() -> None:
    samples = [replace(s, group_id=0) for s in make_samples(1, count=3)]
    assert sorted(i for r in range(3) for i in Shard.split(samples, r, 3).owned) == [0, 1, 2]
    with pytest.raises(ShardError, match="3 trajectories cannot be split over 4 trainer ranks"):
        Shard.split(samples, 0, 4)


def test_mini_batches_of_the_whole_batch_map_to_each_ranks_share() -> None:
    shard = Shard(1, 2, [4, 0, 2], 6)
    assert shard.localize([[0, 1, 2], [3, 4, 5], [1, 3]]) == [[1, 2], [0], []]
