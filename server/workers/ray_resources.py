"""What one replica's Ray actor asks the cluster for, and how its devices are numbered inside
the actor: pure arithmetic (no Ray import), so that it is testable and readable on its own.

- ``cuda``: a replica on one GPU asks a nominal ``GPU_SHARE`` of it, pinned by ``ray_host`` to
  the device's own placement-group bundle of one whole GPU, so that ``cuda:0`` and ``cuda:1``
  of one model never land on the same GPU. The bundle reserves the GPU for this server, so the
  share is bookkeeping inside it, not what decides how many replicas the GPU holds: that is
  memory's (the configuration, or the placer's accounting under ``--placement auto``). A share
  sized to the models known (1 / N) ran out when a reload built its new replica beside the old
  ones, or a model loaded later joined N others, and the new actor waited for the placement
  timeout. A replica spanning several GPUs (a pipeline) asks whole GPUs: Ray hands out
  fractions only below one GPU.
- ``cpu``: one CPU per device (a cpu device computes on its core).
- ``sim``: a small CPU share (a simulated device only sleeps). Not ``num_cpus=0``: a zero
  request fits every node, including a head started with ``--num-cpus 0`` to keep work off it;
  a share still needs a node that offers CPUs, and 100 of them fit on one CPU. Where the cluster
  offers the custom resource ``evenflow_sim``, each sim device also asks one unit of it (that
  resource says where sims go).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from evenflow.server.workers.devices import DeviceSpec

SIM_RESOURCE = "evenflow_sim"  # a node's simulated devices (test clusters, drills)
SIM_CPU_SHARE = 0.01
GPU_SHARE = 0.01  # 100 replicas to a GPU: more than memory lets share one


@dataclass(frozen=True, slots=True)
class RayPlacement:
    """How the server places actors: an actor the cluster cannot place within ``timeout_s``
    fails start-up."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class ActorResources:
    """One actor's request. ``pinned_gpu``: the one cuda device whose placement-group bundle the
    actor runs in (its GPU share is of that bundle's GPU); None for whole-GPU or GPU-less ones."""

    num_cpus: float
    num_gpus: float
    resources: Mapping[str, float] = field(default_factory=dict)
    pinned_gpu: str | None = None

    def asks(self) -> dict[str, float]:
        """The request in Ray's resource names (what ``ray.cluster_resources()`` lists)."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        return {name: amount for name, amount in wanted.items() if amount > 0}


def actor_resources(devices: Sequence[DeviceSpec],
                    sim_resource_offered: bool = False) -> ActorResources:
    """What the actor of a replica on ``devices`` asks for (see the module's docstring)."""
    cuda = [d for d in devices if d.kind == "cuda"]
    cpus = sum(1 for d in devices if d.kind == "cpu")
    sims = sum(1 for d in devices if d.kind == "sim")
    resources = {SIM_RESOURCE: float(sims)} if sims and sim_resource_offered else {}
    num_cpus = round(cpus + SIM_CPU_SHARE * sims, 4)
    if len(cuda) == 1:
        return ActorResources(num_cpus, GPU_SHARE, resources, cuda[0].name)
    return ActorResources(num_cpus, float(len(cuda)), resources)


def actor_devices(devices: Sequence[DeviceSpec]) -> tuple[DeviceSpec, ...]:
    """The devices as the actor sees them: Ray sets CUDA_VISIBLE_DEVICES to the GPUs it gave
    the actor, so its k-th cuda device is ordinal k there, wherever it stands among the
    replica's devices; other kinds keep their index; every name stays the server's."""
    cuda = [d for d in devices if d.kind == "cuda"]
    return tuple(DeviceSpec("cuda", cuda.index(d), d.name, d.speed) if d.kind == "cuda" else d
                 for d in devices)


def placement_report(replica: str, asks: Mapping[str, float], total: Mapping[str, float],
                     available: Mapping[str, float],
                     node_totals: Sequence[Mapping[str, float]]) -> str:
    """Why ``replica`` waits: what it asks for, and how much of each the cluster has (in all,
    and free now); whether any one node could hold it at all."""
    wanted = ", ".join(f"{name} {amount:g}" for name, amount in sorted(asks.items()))
    has = ", ".join(f"{name} {available.get(name, 0.0):g} free of {total.get(name, 0.0):g}"
                    for name in sorted(asks))
    fits = any(all(node.get(name, 0.0) >= amount for name, amount in asks.items())
               for node in node_totals)
    # Placed but still starting (its process imports torch) looks the same from here.
    why = ("a node has that much: the actor is starting, or waits for others to free it"
           if fits else "no node of the cluster has that much")
    return f"replica {replica} asks Ray for {{{wanted}}}; the cluster has {has} ({why})"
