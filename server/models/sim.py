"""The ``sim`` model's module: identity whose cost is spent sleeping, scaled by device speed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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

    def __init__(self, profile: SimProfile,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.profile = profile
        self._sleep = sleep

    @property
    def sim_profile(self) -> SimProfile:
        """The cost the pipeline partitioner plans with (instead of timing sleeps)."""
        return self.profile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cost_s = self.profile.cost_s(x.shape[0])
        if cost_s > 0:  # sleep(0) is not free: ~80 us of timer slack here, and a GIL hand-off
            self._sleep(cost_s / thread_speed())
        return x.clone()
