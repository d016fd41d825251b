"""A group page says what became of the group: trained, never trained and why, not ended, or
an eval group (never trained by design)."""

from __future__ import annotations

from typing import Any

import pytest

from tracerl.view.pages import group_page


def members(kind: str) -> list[dict[str, Any]]:
    return [{"session_id": f"s{i}", "kind": kind, "reward": 1.0, "failed": False} for i in (0, 1)]


@pytest.mark.parametrize(
    ("kind", "ended", "said"),
    [
        ("train", {"group": 3, "outcome": "trained", "step": 7}, "trained at step 7"),
        ("train", {"group": 3, "outcome": "uniform rewards"}, "never trained: uniform rewards"),
        ("train", None, "not ended: its episodes are still playing"),
        ("eval", None, "an eval group: measured, never trained"),
    ],
)
def test_the_group_outcome_line(kind: str, ended: dict[str, Any] | None, said: str) -> None:
    page = group_page(3, members(kind), {}, "", {"s0": None, "s1": None}, ended, 2.0)
    assert f"<p class=group-outcome>{said}" in page and "2 samples" in page
