"""The module one replica runs: its own parameters on its own device, in its own dtype.

Every replica of a model is built from one ``ModelDefinition``, and ``nn.Module.to`` moves and
casts in place: moving the definition's module would leave every replica's weights on whichever
device was built last. So a replica shares the definition's module only where that is provably
safe, when running it there needs no change at all (its parameters and buffers already have
the replica's device and dtype: several CPU float32 replicas share one copy, read-only);
otherwise it gets a copy made straight onto its device, and the definition's module is never
touched.
"""

from __future__ import annotations

import copy
import io
import itertools
import warnings

import torch

from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.cuda_sync import wait_for_stream

_CPU = torch.device("cpu")
# Platforms whose module is a compiled program: its graph, not only its parameters, fixes the
# dtypes it computes in (see ``refuse_recasting``).
_PROGRAM_PLATFORMS = ("pytorch_torchscript", "pytorch_exported_program")


def module_for(definition: ModelDefinition, device: torch.device,
               dtype: torch.dtype) -> torch.nn.Module:
    """The module a replica on ``device`` computing floats in ``dtype`` runs: the definition's
    own where that runs there unchanged, else one whose parameters this replica alone owns.
    Raises ``ProgramDtypeError`` for a TorchScript module or an exported program asked to run
    in a dtype other than its own (see ``refuse_recasting``)."""
    refuse_recasting(definition, dtype)
    shared = definition.module
    if definition.place is not None and device != _CPU:
        module = _cast_owned(definition.place(device), dtype)
    elif runs_unchanged(shared, device, dtype):
        module = shared
    else:
        module = copied_to(shared, device, dtype)
    return settled(module, device)


class ProgramDtypeError(ValueError):
    """A compiled program (TorchScript, torch.export) asked to compute in another dtype than
    the one it was saved in; the message says which and what to do."""


def refuse_recasting(definition: ModelDefinition, dtype: torch.dtype) -> None:
    """Refuse to serve a TorchScript module or an exported program in a dtype other than its
    own (the one dtype of its floating parameters and buffers).

    ``Module.to(dtype)`` casts parameters and buffers only. A trace keeps the tensors its code
    used as constants of the graph, and an exported graph fixes the dtype of what it computes
    (``arange(..., dtype=float32)``, explicit casts); neither is reached by a cast. Under
    ``--dtype bfloat16`` such a model silently computes parts in float32 (a float32 constant
    promotes what it touches) or fails every batch on a dtype mismatch. Running it in its own
    dtype instead would break what the rest of the server assumes (memory counted in the
    served dtype), so it is refused, at build, with what to do.
    """
    module = definition.module
    if not (isinstance(module, torch.jit.ScriptModule)
            or definition.platform in _PROGRAM_PLATFORMS):
        return
    own = sorted({t.dtype for t in _tensors(module) if t.is_floating_point()}, key=str)
    if not own or own == [dtype]:
        return
    kind = "an exported program" if definition.platform == "pytorch_exported_program" else \
        "a TorchScript module"
    held = " and ".join(_name(d) for d in own)
    advice = f"serve it with --dtype {_name(own[0])} (a CPU replica always runs float32) or " \
        f"save it in {_name(dtype)}" if len(own) == 1 else \
        "save it with every floating parameter and buffer in one dtype"
    raise ProgramDtypeError(
        f"{kind} cannot be recast: its floating parameters and buffers are {held}, and this "
        f"replica would compute in {_name(dtype)}; casting the parameters would leave the "
        f"constants and dtypes fixed in its graph as they are, so parts of it would run in "
        f"{held} or fail on a dtype mismatch: {advice}")


def settled(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module``, once the copies and casts that placed it on ``device`` have finished.

    They run on this (building) thread's current stream, the legacy default stream, and the
    worker then reads the weights on a stream of its own from torch's pool, which is created
    non-blocking: nothing orders its kernels after the default stream's, so a first batch could
    read weights still being written (an on-device cast, a GPU-to-GPU copy). Waiting here (on a
    blocking event: asleep, not spinning a core) orders every later use after them."""
    if device.type == "cuda":
        wait_for_stream(torch.cuda.current_stream(device))
    return module


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def runs_unchanged(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether every parameter and buffer is on ``device`` and every floating one in ``dtype``
    (so ``module.to(device, dtype)`` would change nothing)."""
    return all(t.device == device and (t.dtype == dtype or not t.is_floating_point())
               for t in _tensors(module))


def copied_to(module: torch.nn.Module, device: torch.device,
              dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are made directly on ``device``
    (floating ones in ``dtype``), without first copying them on the host; tied weights stay
    tied (a ScriptModule is copied through its serialized form). ``module`` is unchanged."""
    if isinstance(module, torch.jit.ScriptModule):
        return _cast_owned(_reloaded_script(module, device), dtype)
    with torch.no_grad():
        memo: dict[int, object] = {}
        for tensor in _tensors(module):
            if id(tensor) not in memo:
                memo[id(tensor)] = _converted(tensor, device, dtype)
        with warnings.catch_warnings():
            # torch's own deprecation, raised by copying the pytree specs an exported
            # program's module (a GraphModule) carries: nothing a caller can act on.
            warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*deprecated",
                                    category=FutureWarning)
            copied: torch.nn.Module = copy.deepcopy(module, memo)
    return copied


def _reloaded_script(module: torch.jit.ScriptModule, device: torch.device) -> torch.nn.Module:
    """A ScriptModule copied through its serialized form, loaded straight onto ``device``: a
    deepcopy would ignore the memo (it copies the C++ module whole), and ``.to`` would miss the
    tensors its code holds as constants, which ``map_location`` moves too."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated")
        torch.jit.save(module, buffer)
        buffer.seek(0)
        loaded: torch.nn.Module = torch.jit.load(buffer, map_location=device)
    return loaded.train(module.training)


def _converted(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    target = dtype if tensor.is_floating_point() else tensor.dtype
    # copy=True: a tensor already on the device in the dtype must not alias the definition's.
    moved = tensor.detach().to(device=device, dtype=target, copy=True)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(moved, requires_grad=tensor.requires_grad)
    return moved


def _cast_owned(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A module this replica owns, cast in place (only floating tensors change)."""
    if any(t.is_floating_point() and t.dtype != dtype for t in _tensors(module)):
        module = module.to(dtype=dtype)
    return module


def _tensors(module: torch.nn.Module) -> itertools.chain[torch.Tensor]:
    return itertools.chain(module.parameters(), module.buffers())
