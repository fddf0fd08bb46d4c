"""GPU check: one command, a few minutes, one report, on a machine with GPUs and no network.

    python -m benchmarks.gpu_check [--out gpu_check_report] [--dry-run] [--budget-s 450]

Each step runs in its own process under its own time limit (``steps.STEPS``), so a crash, a
hang or a failure in one is recorded and the others still run. ``--dry-run`` runs on a CPU
machine what needs no CUDA (the server steps on ``cpu``) and lists the rest as "needs CUDA", so
CI keeps the command working. See docs/gpu.md.
"""
