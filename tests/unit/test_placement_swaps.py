"""How the move budget cuts a strategy's moves: a swap's drops and the add they make room for
are one unit. Pure: no loop, no clock."""

from __future__ import annotations

import pytest

from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.swaps import units

pytestmark = pytest.mark.timeout(10)


def drop(model: str, device: str) -> tuple[Move, str]:
    return Move("drop", model, device), "plan"


def add(model: str, device: str) -> tuple[Move, str]:
    return Move("add", model, device), "plan"


@pytest.mark.parametrize(("moves", "expected"), [
    ([], []),
    ([drop("b", "d1"), add("a", "d1")], [[drop("b", "d1"), add("a", "d1")]]),
    # Two evicted to make room for one: all three or none.
    ([drop("b", "d1"), drop("c", "d1"), add("a", "d1")],
     [[drop("b", "d1"), drop("c", "d1"), add("a", "d1")]]),
    # A drop on another device makes no room for the add.
    ([drop("b", "d0"), drop("c", "d1"), add("a", "d1")],
     [[drop("b", "d0")], [drop("c", "d1"), add("a", "d1")]]),
    ([drop("b", "d1"), add("a", "d0")], [[drop("b", "d1")], [add("a", "d0")]]),
    # A model moving: the add first, the drop of its old replica a unit of its own.
    ([add("a", "d1"), drop("a", "d0")], [[add("a", "d1")], [drop("a", "d0")]]),
    ([add("a", "d0"), drop("b", "d1"), add("c", "d1"), drop("c", "d0")],
     [[add("a", "d0")], [drop("b", "d1"), add("c", "d1")], [drop("c", "d0")]]),
])
def test_a_swaps_drops_and_its_add_are_one_unit(moves: list[tuple[Move, str]],
                                                 expected: list[list[tuple[Move, str]]]
                                                 ) -> None:
    assert units(moves) == expected
