from tests.unit.trace.test_trajectories import turn
from tracerl.trace.versions import oldest_trainable, oldest_version, staleness, turn_version


def test_a_resumed_turn_is_as_old_as_its_oldest_token() -> None:
    plain = turn(0, [1], [2]).model_copy(update={"weight_version": 4})
    resumed = turn(1, [1, 2], [3]).model_copy(update={"weight_version": 5, "weight_version_min": 3})
    assert turn_version(plain) == 4
    assert turn_version(resumed) == 3
    assert oldest_version([plain, resumed]) == 3


def test_the_staleness_bound_and_the_oldest_trainable_version_agree() -> None:
    # step 10 trains while the engines hold version 9: a version-9 sample is fresh
    assert staleness(10, 9) == 0
    for max_off_policy in (0, 1, 3):
        oldest = oldest_trainable(10, max_off_policy)
        assert staleness(10, oldest) == max_off_policy
        assert staleness(10, oldest - 1) > max_off_policy
