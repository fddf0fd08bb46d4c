"""Device strings from ``--devices``: ``cuda:N``, ``cpu`` / ``cpu:N``, ``sim:SPEED``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One device. ``name`` is unique in the server ("cpu0", "cuda1", "sim2", ...)."""

    kind: str  # "cpu", "cuda" or "sim"
    index: int  # cuda: the GPU ordinal; cpu/sim: the position among devices of that kind
    name: str
    speed: float = 1.0  # sim only


def parse_devices(text: str) -> list[DeviceSpec]:
    """Parse a comma list; raises ValueError naming the bad entry."""
    specs: list[DeviceSpec] = []
    seen: Counter[str] = Counter()
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            raise ValueError(f"empty device in {text!r}")
        kind, _, arg = entry.partition(":")
        if kind == "cpu":
            index = int(arg) if arg else seen["cpu"]
            specs.append(DeviceSpec("cpu", index, f"cpu{index}"))
        elif kind == "cuda":
            if not arg.isdigit():
                raise ValueError(f"bad device {entry!r}: expected cuda:N")
            specs.append(DeviceSpec("cuda", int(arg), f"cuda{arg}"))
        elif kind == "sim":
            try:
                speed = float(arg) if arg else 1.0
            except ValueError:
                raise ValueError(f"bad device {entry!r}: expected sim:SPEED") from None
            if not (math.isfinite(speed) and speed > 0):
                raise ValueError(f"bad device {entry!r}: speed must be a finite number > 0")
            index = seen["sim"]
            specs.append(DeviceSpec("sim", index, f"sim{index}", speed))
        else:
            raise ValueError(f"unknown device {entry!r}: expected cuda:N, cpu[:N] or sim:SPEED")
        seen[kind] += 1
    names = [spec.name for spec in specs]
    duplicates = sorted(name for name, n in Counter(names).items() if n > 1)
    if duplicates:
        raise ValueError(f"devices listed twice: {duplicates}")
    return specs


def lowest_free_index(devices: Iterable[DeviceSpec], kind: str) -> int:
    """The index a device of ``kind`` joining ``devices`` is named by: the lowest one no device
    of that kind has. A node that leaves and comes back gets its names back, so memory
    declared for ``cuda1`` still applies, and names stay within what a cluster has."""
    taken = {d.index for d in devices if d.kind == kind}
    return next(i for i in range(len(taken) + 1) if i not in taken)


def default_devices() -> str:
    """Every visible GPU, else one CPU worker."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ",".join(f"cuda:{i}" for i in range(count)) if count else "cpu"
