"""Which exceptions from a model mean the device itself is lost.

A CUDA device-side assert (an out-of-range embedding index, say), an illegal memory access or a
launch failure leaves the CUDA context *sticky*: every later call on it fails with the same
error. Reporting that as one failed batch would keep a dead replica in routing, so those become
``DeviceLost`` (a ``WorkerLost``: the batch is re-run elsewhere, the replica leaves routing).
"""

from __future__ import annotations

import torch

from evenflow.balancer.errors import BatchFailed, DeviceLost, EvenflowError, OutOfMemory

# Lower-case fragments of CUDA's messages for errors that poison the context (cudaErrorAssert,
# cudaErrorIllegalAddress, cudaErrorLaunchFailure, ...). Matched on the message because older
# torch raises them as a plain RuntimeError.
_STICKY_CUDA_MESSAGES = (
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "cuda error: uncorrectable ecc error",
)

_ACCELERATOR_ERROR: type[BaseException] | None = getattr(torch, "AcceleratorError", None)


def is_sticky_device_error(exc: BaseException) -> bool:
    """True when ``exc`` says the device's context can run nothing any more."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False  # recoverable: a smaller batch may fit
    if _ACCELERATOR_ERROR is not None and isinstance(exc, _ACCELERATOR_ERROR):
        return True
    message = str(exc).lower()
    return any(fragment in message for fragment in _STICKY_CUDA_MESSAGES)


def classify_device_error(exc: BaseException, *, device: str = "") -> EvenflowError:
    """Map what a model raised to the balancer's error taxonomy: a sticky device failure is
    ``DeviceLost``, running out of memory is ``OutOfMemory``, anything else is ``BatchFailed``
    with the model's message. An ``EvenflowError`` is returned unchanged."""
    if isinstance(exc, EvenflowError):
        return exc
    where = f" on {device}" if device else ""
    if isinstance(exc, torch.OutOfMemoryError):
        return OutOfMemory(f"out of memory{where}: {exc}")
    if is_sticky_device_error(exc):
        return DeviceLost(f"device lost{where}: {type(exc).__name__}: {exc}")
    return BatchFailed(f"model raised {type(exc).__name__}: {exc}")
