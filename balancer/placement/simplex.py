"""A small dense linear program: maximize ``c . x`` subject to ``A x <= b``, ``x >= 0``, with
``b >= 0`` (the origin is feasible, so no first phase is needed).

The placement planner solves one of these per candidate placement, with a few dozen variables;
a dependency on a numerical library for that is not worth its weight in the scheduler.
Bland's rule (lowest index enters, lowest index leaves on ties) makes it terminate.
"""

from __future__ import annotations

from collections.abc import Sequence

_EPS = 1e-12


def maximize(c: Sequence[float], a: Sequence[Sequence[float]],
             b: Sequence[float]) -> tuple[float, list[float]]:
    """The optimum value and a solution ``x``. Raises ValueError on a negative ``b`` and when
    the objective is unbounded (a placement LP never is: every variable is capped by a row)."""
    rows, cols = len(a), len(c)
    if any(value < 0 for value in b):
        raise ValueError("maximize needs b >= 0 (the origin must be feasible)")
    # Tableau: each row is [A | I | b]; the objective row holds -c (reduced costs).
    width = cols + rows + 1
    tableau = [[*a[i], *(1.0 if j == i else 0.0 for j in range(rows)), float(b[i])]
               for i in range(rows)]
    objective = [*(-float(v) for v in c), *([0.0] * rows), 0.0]
    basis = [cols + i for i in range(rows)]
    while True:
        entering = next((j for j in range(width - 1) if objective[j] < -_EPS), None)
        if entering is None:
            break
        leaving, best_ratio = -1, 0.0
        for i in range(rows):
            coefficient = tableau[i][entering]
            if coefficient > _EPS:
                ratio = tableau[i][-1] / coefficient
                if leaving < 0 or ratio < best_ratio - _EPS or (
                        abs(ratio - best_ratio) <= _EPS and basis[i] < basis[leaving]):
                    leaving, best_ratio = i, ratio
        if leaving < 0:
            raise ValueError("the linear program is unbounded")
        pivot_row = tableau[leaving]
        pivot = pivot_row[entering]
        pivot_row[:] = [value / pivot for value in pivot_row]
        for i in range(rows):
            if i != leaving:
                factor = tableau[i][entering]
                if factor:
                    row = tableau[i]
                    row[:] = [value - factor * p for value, p in zip(row, pivot_row, strict=True)]
        factor = objective[entering]
        objective[:] = [value - factor * p for value, p in zip(objective, pivot_row, strict=True)]
        basis[leaving] = entering
    x = [0.0] * cols
    for i, variable in enumerate(basis):
        if variable < cols:
            x[variable] = tableau[i][-1]
    return objective[-1], x
