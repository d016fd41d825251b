import itertools

import pytest

from tracerl.train.phases import MemoryPhases, Phase, PhaseError

IDL, REF, BEH, CRI, ACT = Phase.IDLE, Phase.REFERENCE, Phase.BEHAVIOUR, Phase.CRITIC, Phase.ACTOR
R_OUT, R_IN = ("reference", "host"), ("reference", "device")
A_OUT, A_IN = ("actor", "host"), ("actor", "device")
C_OUT, C_IN = ("critic", "host"), ("critic", "device")
NO = None  # refused

# Every (from, to): the transfers it makes, in order, or NO. Written out by hand.
TABLE = {
    (IDL, IDL): [], (IDL, REF): [R_IN], (IDL, BEH): [A_IN], (IDL, CRI): [C_IN], (IDL, ACT): [A_IN],
    (REF, IDL): [R_OUT], (REF, REF): [], (REF, BEH): [R_OUT, A_IN], (REF, CRI): [R_OUT, C_IN],
    (REF, ACT): [R_OUT, A_IN],
    (BEH, IDL): [A_OUT], (BEH, REF): NO, (BEH, BEH): [], (BEH, CRI): [A_OUT, C_IN],
    (BEH, ACT): [],  # the actor is resident already: a phase stamp, no transfer
    (CRI, IDL): [C_OUT], (CRI, REF): NO, (CRI, BEH): NO, (CRI, CRI): [], (CRI, ACT): [C_OUT, A_IN],
    (ACT, IDL): [A_OUT], (ACT, REF): NO, (ACT, BEH): NO, (ACT, CRI): NO, (ACT, ACT): [],
}  # fmt: skip


def test_the_table_covers_every_pair() -> None:
    assert set(TABLE) == set(itertools.product(Phase, Phase))


@pytest.mark.parametrize(("source", "target"), sorted(TABLE))
def test_every_transition(source: Phase, target: Phase) -> None:
    moved: list[tuple[str, str]] = []
    phases = MemoryPhases(lambda model, place: moved.append((model, place)))
    phases.enter(source)
    moved.clear()
    phases.transfers.clear()
    still = MemoryPhases()  # CPU: no transfers, the same rules
    still.enter(source)
    expected = TABLE[(source, target)]
    if expected is NO:
        for machine in (phases, still):
            with pytest.raises(PhaseError, match=f"from {source.name} back to {target.name}"):
                machine.enter(target)
            assert machine.phase == source  # a refused transition changes nothing
        assert moved == []
        return
    phases.enter(target)
    still.enter(target)
    assert moved == expected and phases.transfers == expected
    assert phases.phase == still.phase == target
    assert still.transfers == []


def test_two_models_never_share_the_device_over_whole_steps() -> None:
    resident: set[str] = set()
    peak = 0

    def move(model: str, place: str) -> None:
        nonlocal peak
        if place == "device":
            assert model not in resident, f"{model} moved in twice"
            resident.add(model)
        else:
            resident.remove(model)
        peak = max(peak, len(resident))

    phases = MemoryPhases(move)
    # ppo with KL-in-reward, two critic-warmup steps (which end without an actor phase: the
    # seed's crash on the second one), a full step, a group-baseline step
    steps = [
        [REF, CRI, IDL],
        [REF, CRI, IDL],
        [REF, BEH, CRI, ACT, IDL],
        [REF, BEH, ACT, IDL],
    ]
    for step in steps:
        for phase in step:
            phases.enter(phase)
    assert peak == 1 and resident == set()


def test_a_model_used_outside_its_phase_is_refused() -> None:
    phases = MemoryPhases()
    phases.enter(CRI)
    phases.require("critic")
    with pytest.raises(PhaseError, match="actor used in phase CRITIC"):
        phases.require("actor")
    with pytest.raises(PhaseError, match="save_checkpoint needs phase IDLE"):
        phases.require_idle("save_checkpoint")
    phases.enter(ACT)
    phases.require("actor")
    phases.enter(IDL)
    phases.require_idle("save_checkpoint")
    with pytest.raises(PhaseError, match="reference used in phase IDLE"):
        phases.require("reference")
