"""Which model is resident on the accelerator in each phase of a step: a pure state machine.

A step moves forward through its phases and may skip any of them:

    IDLE -> REFERENCE -> BEHAVIOUR -> CRITIC -> ACTOR -> IDLE
            ref log-probs  actor log-probs  values,     actor
                           (no grad)        critic      update
                                            update

Each phase has one resident model (none in IDLE). Entering a phase first moves the models it
does not use to the host (freeing memory), then moves in the model it uses, so two models never
share the accelerator. A move backwards (say CRITIC -> REFERENCE) is refused: it would fault a
model back in mid-step to recompute something the step should already hold, and it always
means the step was assembled in the wrong order. Entering the current phase, or a phase whose
model is already resident (BEHAVIOUR -> ACTOR), moves nothing: a critic-warmup step that ends
without its actor phase must not make the next step's first transition fail. Any phase may go
to IDLE (a finished or aborted step).

The machine performs no transfer itself: it calls `transfer(model, "device" | "host")`. On the
CPU, or with offloading off, there is no `transfer` and every model stays where it is; the same
transitions are checked.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Literal

Place = Literal["device", "host"]
Transfer = Callable[[str, Place], None]


class Phase(enum.IntEnum):
    IDLE = 0
    REFERENCE = 1
    BEHAVIOUR = 2
    CRITIC = 3
    ACTOR = 4


RESIDENT: dict[Phase, str | None] = {
    Phase.IDLE: None,
    Phase.REFERENCE: "reference",
    Phase.BEHAVIOUR: "actor",
    Phase.CRITIC: "critic",
    Phase.ACTOR: "actor",
}


class PhaseError(RuntimeError):
    """A transition or a model use that the current phase does not allow."""


class MemoryPhases:
    """The phase of the current step and the transfers that entering another one needs.

    `transfer` is None when nothing ever moves (CPU, or offloading off). Models start on the
    host when transfers are on: the machine starts in IDLE.
    """

    def __init__(self, transfer: Transfer | None = None) -> None:
        self.phase = Phase.IDLE
        self._transfer = transfer
        self.transfers: list[tuple[str, Place]] = []  # every move made, in order

    def enter(self, target: Phase) -> None:
        if target < self.phase and target != Phase.IDLE:
            raise PhaseError(
                f"cannot go from {self.phase.name} back to {target.name}: a step moves forward "
                "(IDLE, REFERENCE, BEHAVIOUR, CRITIC, ACTOR)"
            )
        leaving, coming = RESIDENT[self.phase], RESIDENT[target]
        if leaving != coming:
            if leaving is not None:
                self._move(leaving, "host")
            if coming is not None:
                self._move(coming, "device")
        self.phase = target

    def require(self, model: str) -> None:
        """Fail unless `model` is the resident one: a use outside its phase would run it on the
        wrong device, or fault it in next to another model."""
        if RESIDENT[self.phase] != model:
            raise PhaseError(f"{model} used in phase {self.phase.name}, where it is not resident")

    def require_idle(self, what: str) -> None:
        if self.phase != Phase.IDLE:
            raise PhaseError(f"{what} needs phase IDLE, the trainer is in {self.phase.name}")

    def _move(self, model: str, place: Place) -> None:
        if self._transfer is not None:
            self._transfer(model, place)
            self.transfers.append((model, place))
