"""Which moves of a strategy's list start together under the move budget: a swap's drop and the
add it makes room for.

A plan, an overflow change or the tuner frees a device's memory with drops and fills it with an
add right after them (``Move``'s docstring). Cut between the two, a drop runs alone: the model
loses a replica and the one it made room for never comes, until a later tick has budget for it.
So the budget counts such a run of moves as one unit, which runs whole or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from evenflow.balancer.placement.moves import Move

T = TypeVar("T")


def units(moves: Sequence[tuple[Move, T]]) -> list[list[tuple[Move, T]]]:
    """``moves`` in order, cut into units: the drops on one device followed at once by an add
    on that device are one unit (a swap); every other move is a unit of its own."""
    cut: list[list[tuple[Move, T]]] = []
    drops: list[tuple[Move, T]] = []  # consecutive drops on one device, no add after them yet
    for item in moves:
        move = item[0]
        if drops and move.device != drops[-1][0].device:
            cut += [[drop] for drop in drops]
            drops = []
        if move.kind == "drop":
            drops.append(item)
            continue
        cut.append([*drops, item])
        drops = []
    return cut + [[drop] for drop in drops]
