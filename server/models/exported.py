"""``torch.export`` programs (``.pt2`` files written by ``torch.export.save``).

The tensor spec comes from the program itself: input names from the signature of the exported
``forward``, datatypes and shapes from the example values recorded on the graph. The first
dimension of every input and output must be dynamic (``torch.export.Dim``), or the program
could only ever run one batch size. Outputs are named by the keys of a returned dict, else
``output__0``, ``output__1``, ... (the names Triton's PyTorch backend uses).

A graph records devices in its nodes (``torch.arange(n, device=x.device)`` exported on a CPU
keeps ``device=cpu``), which moving the module's parameters leaves alone; so each replica off
the CPU loads its own copy of the program and places it with torch.export's device pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.passes import move_to_device_pass

from evenflow.server.models.spec import ModelDefinition, TensorSpec

EXPORTED_SUFFIX = ".pt2"

_WIRE_OF_DTYPE = {
    torch.bool: "BOOL", torch.uint8: "UINT8", torch.int8: "INT8", torch.int16: "INT16",
    torch.int32: "INT32", torch.int64: "INT64", torch.float16: "FP16", torch.bfloat16: "BF16",
    torch.float32: "FP32", torch.float64: "FP64",
}


class ExportedProgramError(ValueError):
    """The file is not a program evenflow can serve; the message says why."""


def load_exported(path: Path) -> ModelDefinition:
    if not path.is_file():
        raise ExportedProgramError(f"{path}: no such file")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # torch raises many kinds for a file that is not a program
        raise ExportedProgramError(f"{path}: not a torch.export program ({exc})") from exc
    inputs = _input_specs(path, program)
    outputs = _output_specs(path, program)
    return ModelDefinition(module=placed_program(program, torch.device("cpu")), inputs=inputs,
                           outputs=outputs, platform="pytorch_exported_program",
                           traceable=False, place=lambda device: load_placed(path, device))


def load_placed(path: Path, device: torch.device) -> torch.nn.Module:
    """A fresh copy of the program in ``path``, its weights and graph on ``device``."""
    return placed_program(torch.export.load(str(path)), device)


def placed_program(program: torch.export.ExportedProgram,
                   device: torch.device) -> torch.nn.Module:
    """``program`` as a module whose weights and every device a node names are ``device``.
    The pass rewrites ``program`` in place: give it one nobody else holds."""
    return move_to_device_pass(program, device).module()


def _tensor_spec(path: Path, name: str, value: Any) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise ExportedProgramError(f"{path}: {name!r} is a {type(value).__name__}, not a tensor")
    datatype = _WIRE_OF_DTYPE.get(value.dtype)
    if datatype is None:
        raise ExportedProgramError(f"{path}: {name!r} has dtype {value.dtype}, which has no "
                                   "KServe v2 datatype")
    if value.dim() == 0 or isinstance(value.shape[0], int):
        raise ExportedProgramError(
            f"{path}: {name!r} has a static first dimension {tuple(value.shape)}; export with a "
            "dynamic batch dimension, e.g. dynamic_shapes={'x': {0: torch.export.Dim('batch')}}")
    shape = (-1, *(d if isinstance(d, int) else -1 for d in value.shape[1:]))
    return TensorSpec(name, datatype, shape)


def _user_input_nodes(program: torch.export.ExportedProgram) -> dict[str, Any]:
    wanted = set(program.graph_signature.user_inputs)
    return {node.name: node.meta.get("val") for node in program.graph.nodes
            if node.op == "placeholder" and node.name in wanted}


def _input_specs(path: Path, program: torch.export.ExportedProgram) -> list[TensorSpec]:
    in_spec = program.call_spec.in_spec
    args_spec, kwargs_spec = in_spec.children() if in_spec is not None else (None, None)
    if kwargs_spec is not None and kwargs_spec.num_leaves:
        raise ExportedProgramError(f"{path}: keyword-only inputs are not supported")
    names = _forward_arg_names(program)
    values = list(_user_input_nodes(program).values())
    if args_spec is not None and args_spec.num_leaves != len(values):
        raise ExportedProgramError(f"{path}: inputs must be plain tensors, one per argument")
    if len(names) != len(values):
        names = [f"input__{i}" for i in range(len(values))]
    return [_tensor_spec(path, name, value) for name, value in zip(names, values, strict=True)]


def _forward_arg_names(program: torch.export.ExportedProgram) -> list[str]:
    """The exported forward's positional parameter names, as the user wrote them."""
    specs = program.graph_signature.input_specs
    from torch.export.graph_signature import InputKind

    return [spec.arg.name for spec in specs if spec.kind == InputKind.USER_INPUT]


def _output_specs(path: Path, program: torch.export.ExportedProgram) -> list[TensorSpec]:
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = [arg.meta.get("val") for arg in pytree.tree_leaves(output_node.args[0])]
    values = values[-len(program.graph_signature.user_outputs):]
    out_spec = program.call_spec.out_spec
    if out_spec is not None and out_spec.type is dict:
        names = [str(key) for key in out_spec.context]
    else:
        names = [f"output__{i}" for i in range(len(values))]
    if len(names) != len(values):
        raise ExportedProgramError(f"{path}: outputs must be a tensor, a tuple of tensors or a "
                                   "dict of tensors")
    return [_tensor_spec(path, name, value) for name, value in zip(names, values, strict=True)]
