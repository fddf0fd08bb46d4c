"""Placement: which models have replicas on which devices, within memory, from the measured
demand and the latency fits (``planner``, ``assessment``), tuned on a fast timescale
(``tuner``), carried out on live balancers (``placer``)."""
