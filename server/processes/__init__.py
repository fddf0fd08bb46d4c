"""evenflow's child processes (front-ends, worker processes) and what crosses between them (IPC)."""
