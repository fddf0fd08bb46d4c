"""The ``sim`` model's module: identity whose cost is spent sleeping, scaled by device speed."""

from __future__ import annotations

import threading
import time

import torch

from evenflow.server.models.spec import SimProfile

_device = threading.local()


def set_thread_speed(speed: float) -> None:
    """Called by a worker thread: the speed of the device this thread stands for."""
    _device.speed = speed


def thread_speed() -> float:
    return getattr(_device, "speed", 1.0)


class SleepIdentity(torch.nn.Module):
    """Returns its input; each call costs ``profile.cost_s(batch) / speed`` of sleep, where speed is
    the calling worker's device speed (1 on real devices), so devices, not the front-end, bound
    throughput and uneven devices can be reproduced on any machine."""

    def __init__(self, profile: SimProfile) -> None:
        super().__init__()
        self.profile = profile

    @property
    def sim_profile(self) -> SimProfile:
        """The cost the pipeline partitioner plans with (instead of timing sleeps)."""
        return self.profile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.profile.cost_s(x.shape[0]) / thread_speed())
        return x.clone()
