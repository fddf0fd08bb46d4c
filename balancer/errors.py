"""The balancer's error taxonomy. Each error carries a neutral code that the server maps once to a
gRPC status; nothing here knows about gRPC.

    EvenflowError                  base; ``code`` says what kind of failure it is
    ├── ModelNotFound              NOT_FOUND: no such model or version
    ├── DeviceNotFound             NOT_FOUND: no such (simulated) device
    ├── InvalidRequest             INVALID_ARGUMENT: the request does not match the model
    ├── DeadlineExceeded           DEADLINE_EXCEEDED: the deadline passed before the work ran
    ├── Overloaded                 RESOURCE_EXHAUSTED: admission refused the request (queue full)
    ├── ShuttingDown               UNAVAILABLE: the server is draining and takes no new work
    ├── BatchFailed                INTERNAL: the model raised while running the batch
    │   └── OutOfMemory            INTERNAL once retries are exhausted; the balancer splits first
    └── WorkerLost                 UNAVAILABLE: the worker died or hung (its work is re-run once
        │                          elsewhere first)
        └── DeviceLost             UNAVAILABLE: the device's context is poisoned (a sticky CUDA
                                   error such as a device-side assert): the replica leaves
                                   routing for good, its work is re-run once elsewhere; a worker
                                   in its own process is restarted into a fresh context
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    NOT_FOUND = "not_found"
    INVALID_ARGUMENT = "invalid_argument"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class EvenflowError(Exception):
    """``not_run``: raised before the request reached a worker (refused as it arrived, or
    dropped from a queue or a parking lot), so nothing of it ran and a client may send it
    again; an error after its batch started (a lost worker, a cancelled batch) may follow a
    run, and is not marked."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, *args: object, not_run: bool = False) -> None:
        super().__init__(*args)
        self.not_run = not_run


class ModelNotFound(EvenflowError):
    code = ErrorCode.NOT_FOUND


class DeviceNotFound(EvenflowError):
    code = ErrorCode.NOT_FOUND


class InvalidRequest(EvenflowError):
    code = ErrorCode.INVALID_ARGUMENT


class DeadlineExceeded(EvenflowError):
    code = ErrorCode.DEADLINE_EXCEEDED


class Overloaded(EvenflowError):
    code = ErrorCode.RESOURCE_EXHAUSTED


class ShuttingDown(EvenflowError):
    code = ErrorCode.UNAVAILABLE


class BatchFailed(EvenflowError):
    code = ErrorCode.INTERNAL


class OutOfMemory(BatchFailed):
    """The device ran out of memory on this batch; a smaller batch may fit."""


class WorkerLost(EvenflowError):
    """The worker died, or did not answer within the watchdog: its batch never finished."""

    code = ErrorCode.UNAVAILABLE


class DeviceLost(WorkerLost):
    """The device failed in a way that poisons its context for every later batch (a CUDA
    device-side assert, an illegal memory access): no batch on this context can succeed again."""
