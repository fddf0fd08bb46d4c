"""Step (e): host-to-device and device-to-host copy bandwidth, pageable and pinned, per GPU."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.gpu_check.context import StepContext

COPY_BYTES = 256 << 20
REPEATS = 5


def bandwidth(ctx: StepContext) -> dict[str, Any]:
    return {"copy_bytes": COPY_BYTES, "repeats": REPEATS,
            "gb_per_s": {f"cuda:{i}": _device_bandwidth(torch.device("cuda", i))
                         for i in range(torch.cuda.device_count())}}


def _device_bandwidth(device: torch.device) -> dict[str, float]:
    """Best of ``REPEATS`` copies each way (GB/s, 1e9 bytes), timed with CUDA events."""
    on_device = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    result = {}
    for memory in ("pageable", "pinned"):
        host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=memory == "pinned")
        host.fill_(1)
        result[f"host_to_device_{memory}"] = _best_gb_per_s(lambda h=host: on_device.copy_(h),
                                                            device)
        result[f"device_to_host_{memory}"] = _best_gb_per_s(lambda h=host: h.copy_(on_device),
                                                            device)
    return result


def _best_gb_per_s(copy: Any, device: torch.device) -> float:
    with torch.cuda.device(device):
        copy()  # the first copy pays for lazy set-up
        torch.cuda.synchronize()
        best_s = float("inf")
        for _ in range(REPEATS):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            copy()
            end.record()
            end.synchronize()
            best_s = min(best_s, begin.elapsed_time(end) / 1e3)
    return COPY_BYTES / best_s / 1e9
