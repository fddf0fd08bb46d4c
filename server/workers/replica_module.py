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

_CPU = torch.device("cpu")


def module_for(definition: ModelDefinition, device: torch.device,
               dtype: torch.dtype) -> torch.nn.Module:
    """The module a replica on ``device`` computing floats in ``dtype`` runs: the definition's
    own where that runs there unchanged, else one whose parameters this replica alone owns."""
    shared = definition.module
    if definition.place is not None and device != _CPU:
        return _cast_owned(definition.place(device), dtype)
    if runs_unchanged(shared, device, dtype):
        return shared
    return copied_to(shared, device, dtype)


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
