"""Building one replica's worker on threads of the calling process: what the ``thread`` host
does in the serving process, and what a worker process or a Ray actor does in its own."""

from __future__ import annotations

import dataclasses

import torch

from evenflow.balancer import Worker
from evenflow.server.config.server_config import DTYPES
from evenflow.server.models.repository import load_definition
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.pipeline.worker import PipelineWorker
from evenflow.server.workers.torch_worker import SimWorker, TorchWorker
from evenflow.server.workers.worker_spec import WorkerSpec

# The names are stated once, in config (which must not import torch); each is a torch dtype.
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


def load_spec_definition(spec: WorkerSpec) -> ModelDefinition:
    """The model a spec names, with its tensor spec overridden where the configuration says."""
    definition = load_definition(spec.source, spec.builtins)
    if spec.inputs is not None or spec.outputs is not None:
        definition = dataclasses.replace(definition, inputs=spec.inputs or definition.inputs,
                                         outputs=spec.outputs or definition.outputs)
    return definition


def build_thread_worker(spec: WorkerSpec, definition: ModelDefinition) -> Worker:
    """The worker of one replica, running on threads of this process (blocking: it moves the
    module to its devices and traces it)."""
    dtype = TORCH_DTYPES[spec.dtype]
    devices = spec.devices
    if len(devices) > 1:
        # Per stage, as for a replica of one device (--dtype is the GPUs' precision, float32
        # elsewhere), not the first device's for all: that ran a cpu,cuda:0 pipeline's GPU
        # stage in float32 and a cuda:0,cpu pipeline's CPU stage in --dtype.
        return PipelineWorker(model_name=spec.model_name, definition=definition,
                              devices=devices, cpu_threads=spec.cpu_threads,
                              dtype=[dtype if d.kind == "cuda" else torch.float32
                                     for d in devices],
                              partition=spec.pipeline.partition,
                              repartition=spec.pipeline.repartition)
    device = devices[0]
    if device.kind == "sim":
        return SimWorker(model_name=spec.model_name, definition=definition, device=device,
                         cpu_threads=spec.cpu_threads)
    return TorchWorker(model_name=spec.model_name, definition=definition, device=device,
                       dtype=dtype if device.kind == "cuda" else torch.float32,
                       cpu_threads=spec.cpu_threads)
