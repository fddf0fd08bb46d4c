"""Which exceptions from a model mean the device itself is lost.

A CUDA device-side assert (an out-of-range embedding index, say), an illegal memory access or a
launch failure leaves the CUDA context *sticky*: every later call on it fails with the same
error. Reporting that as one failed batch would keep a dead replica in routing, so those become
``DeviceLost`` (a ``WorkerLost``: the batch is re-run elsewhere, the replica leaves routing).

Running out of memory is recoverable (a smaller batch may fit), but it does not always arrive
as ``torch.OutOfMemoryError``: the TorchScript interpreter (a traced model) rethrows whatever
an operation raised as a plain ``RuntimeError`` whose message embeds the original one
("The following operation failed in the TorchScript interpreter. ... CUDA out of memory"), and
a failed ``cudaMalloc`` outside the caching allocator, or cuBLAS/cuDNN failing to allocate
their workspace, is a CUDA error, not the allocator's exception. Those are matched on the
message too.
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

# Lower-case fragments of the messages torch gives running out of device memory: the caching
# allocator's ("CUDA out of memory. Tried to allocate ..."), CUDA's own cudaErrorMemoryAllocation
# ("CUDA error: out of memory"), and cuBLAS's and cuDNN's failures to allocate.
_OUT_OF_MEMORY_MESSAGES = (
    "cuda out of memory",
    "cuda error: out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
)

_ACCELERATOR_ERROR: type[BaseException] | None = getattr(torch, "AcceleratorError", None)


def is_out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` says the device ran out of memory, however torch wrapped it."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    message = str(exc).lower()
    return any(fragment in message for fragment in _OUT_OF_MEMORY_MESSAGES)


def is_sticky_device_error(exc: BaseException) -> bool:
    """True when ``exc`` says the device's context can run nothing any more."""
    if is_out_of_memory(exc):
        # Recoverable: a smaller batch may fit. Checked first because newer torch raises a
        # failed cudaMalloc ("CUDA error: out of memory") as an AcceleratorError too.
        return False
    if _ACCELERATOR_ERROR is not None and isinstance(exc, _ACCELERATOR_ERROR):
        return True
    message = str(exc).lower()
    return any(fragment in message for fragment in _STICKY_CUDA_MESSAGES)


def classify_device_error(exc: BaseException, *, device: str = "",
                          raiser: str = "model") -> EvenflowError:
    """Map what a model raised to the balancer's error taxonomy: a sticky device failure is
    ``DeviceLost``, running out of memory is ``OutOfMemory``, anything else is ``BatchFailed``
    with the message of ``raiser`` (what ran: the model, a pipeline's stage). An
    ``EvenflowError`` is returned unchanged."""
    if isinstance(exc, EvenflowError):
        return exc
    where = f" on {device}" if device else ""
    if is_out_of_memory(exc):
        return OutOfMemory(f"out of memory{where}: {exc}")
    if is_sticky_device_error(exc):
        return DeviceLost(f"device lost{where}: {type(exc).__name__}: {exc}")
    return BatchFailed(f"{raiser} raised {type(exc).__name__}: {exc}")
