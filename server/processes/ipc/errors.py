"""Errors across a process boundary: the class name, the message and ``not_run`` travel, and
the receiver raises the same evenflow error (or, for anything else, BatchFailed with the
message)."""

from __future__ import annotations

import msgspec

from evenflow.balancer import errors

# Every error of the taxonomy, and the two the worker seam's controls raise.
_CLASSES: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (*vars(errors).values(), KeyError, ValueError)
    if isinstance(cls, type) and issubclass(cls, (errors.EvenflowError, KeyError, ValueError))}


class WireError(msgspec.Struct, array_like=True, frozen=True):
    kind: str
    message: str
    not_run: bool = False  # ``EvenflowError.not_run``


def to_wire(error: BaseException) -> WireError:
    kind = type(error).__name__
    if kind not in _CLASSES:
        return WireError("BatchFailed", f"{kind}: {error}")
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return WireError(kind, str(message), getattr(error, "not_run", False))


def from_wire(error: WireError) -> Exception:
    kind = _CLASSES.get(error.kind, errors.BatchFailed)
    if issubclass(kind, errors.EvenflowError):
        return kind(error.message, not_run=error.not_run)
    return kind(error.message)
