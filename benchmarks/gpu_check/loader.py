"""Keeps one GPU busy from another process (``python -m benchmarks.gpu_check.loader N``):
bfloat16 matmuls back to back until killed, so the device serves evenflow at a fraction of its
speed, as a GPU shared with another job does."""

from __future__ import annotations

import sys

import torch

SIDE = 8192


def main() -> None:
    device = torch.device("cuda", int(sys.argv[1]))
    a = torch.randn(SIDE, SIDE, device=device, dtype=torch.bfloat16)
    b = torch.randn(SIDE, SIDE, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize(device)
    print("loading", flush=True)
    while True:
        for _ in range(16):
            a = torch.matmul(a, b).clamp_(-1, 1)
        torch.cuda.synchronize(device)  # bounded queue: the kill lands within one round


if __name__ == "__main__":
    main()
