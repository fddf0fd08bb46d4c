"""What evenflow exports to Prometheus.

Per model, Triton's metric names and meanings (``nv_inference_*``, labels ``model`` and
``version``), so dashboards and alerts written for Triton work unchanged; per replica, the
balancer's live state (``evenflow_replica_*``: busy fraction, queue, outstanding work, batch
size, the fitted latency model); per GPU, the NVML sampler's last reading. Built from the same
statistics and snapshots as ModelStatistics and the stats RPC, at scrape time, on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from evenflow.balancer import ReplicaSnapshot
from evenflow.balancer.placement.report import PlacementSnapshot
from evenflow.balancer.stats import DROP_REASONS, REJECT_REASONS, ModelStatistics
from evenflow.server.edge.model_names import MODEL_VERSION
from evenflow.server.engine.served import ServedModel
from evenflow.server.observability.prometheus import MetricFamily, histogram
from evenflow.server.observability.telemetry import GpuSample


@dataclass(frozen=True, slots=True)
class FrontendState:
    index: int
    up: bool
    restarts: int

_US = 1e6

# name, kind, help, value of a ReplicaSnapshot
_REPLICA_METRICS: tuple[tuple[str, str, str, Callable[[ReplicaSnapshot], float]], ...] = (
    ("evenflow_replica_busy_ratio", "gauge",
     "Fraction of the last second the replica spent running batches", lambda r: r.busy_fraction),
    ("evenflow_replica_busy_seconds_total", "counter",
     "Seconds the replica spent running batches", lambda r: r.busy_s),
    ("evenflow_replica_queued_requests", "gauge",
     "Requests waiting in the replica's queue", lambda r: r.queued_requests),
    ("evenflow_replica_queued_samples", "gauge",
     "Samples waiting in the replica's queue", lambda r: r.queued_samples),
    ("evenflow_replica_running_requests", "gauge",
     "Requests in the batches the replica is running", lambda r: r.running_requests),
    ("evenflow_replica_outstanding_work_seconds", "gauge",
     "Predicted seconds until the replica has finished everything it holds",
     lambda r: r.outstanding_work_s),
    ("evenflow_replica_batch_size", "gauge",
     "The batch-size controller's current size for the replica", lambda r: r.batch_size),
    ("evenflow_replica_fit_base_seconds", "gauge",
     "Fitted fixed cost per batch, a in t(b) = a + c*b", lambda r: r.fit_base_s),
    ("evenflow_replica_fit_per_sample_seconds", "gauge",
     "Fitted cost per sample, c in t(b) = a + c*b", lambda r: r.fit_per_sample_s),
    ("evenflow_replica_fit_reliable", "gauge",
     "1 when the latency fit is trusted, 0 while the controller falls back to AIMD",
     lambda r: float(r.fit_reliable)),
    ("evenflow_replica_batches_total", "counter",
     "Batches the replica has run", lambda r: r.num_batches),
    ("evenflow_replica_samples_total", "counter",
     "Samples the replica has run", lambda r: r.num_samples),
    ("evenflow_replica_stolen_requests_total", "counter",
     "Requests the replica took from busier replicas' queues", lambda r: r.num_stolen_requests),
    ("evenflow_replica_turn_wait_seconds_total", "counter",
     "Seconds the replica's ready batches waited for other models' batches on its device",
     lambda r: r.turn_wait_s),
    ("evenflow_replica_healthy", "gauge",
     "1 while the replica is in routing, 0 while its lost worker restarts",
     lambda r: float(r.healthy)),
    ("evenflow_replica_restarts_total", "counter",
     "Times the replica's worker was restarted after dying or hanging", lambda r: r.restarts),
    ("evenflow_replica_repartitions_total", "counter",
     "Times the replica's pipeline was re-partitioned", lambda r: r.num_repartitions),
)

# name, help, the GpuSample field it reads, its value
_GPU_METRICS: tuple[tuple[str, str, str, Callable[[GpuSample], float]], ...] = (
    ("nv_gpu_utilization", "GPU utilization rate (0.0 - 1.0)", "utilization",
     lambda g: g.utilization),
    ("nv_gpu_memory_total_bytes", "Total GPU memory, in bytes", "memory_total_bytes",
     lambda g: g.memory_total_bytes),
    ("nv_gpu_memory_used_bytes", "Used GPU memory, in bytes", "memory_used_bytes",
     lambda g: g.memory_used_bytes),
    ("evenflow_gpu_sm_clock_hertz", "SM clock", "sm_clock_mhz", lambda g: g.sm_clock_mhz * 1e6),
    ("evenflow_gpu_temperature_celsius", "GPU temperature", "temperature_c",
     lambda g: g.temperature_c),
    ("evenflow_gpu_throttle_reasons", "NVML clock throttle reasons (bit mask)",
     "throttle_reasons", lambda g: g.throttle_reasons),
)

_GPU_STALE = "evenflow_gpu_telemetry_stale"
# Exported only with NVML.
GPU_METRIC_NAMES = frozenset({*(name for name, _, _, _ in _GPU_METRICS), _GPU_STALE})


def _model_families(models: Iterable[ServedModel]) -> list[MetricFamily | Metric]:
    success = MetricFamily("nv_inference_request_success", "counter",
                           "Number of successful inference requests")
    failure = MetricFamily("nv_inference_request_failure", "counter",
                           "Number of failed inference requests")
    count = MetricFamily("nv_inference_count", "counter",
                         "Number of inferences performed (a batch of n counts n)")
    exec_count = MetricFamily("nv_inference_exec_count", "counter",
                              "Number of batch executions")
    pending = MetricFamily("nv_inference_pending_request_count", "gauge",
                           "Requests waiting in the model's queues")
    durations = [
        (MetricFamily("nv_inference_request_duration_us", "counter",
                      "Cumulative time of successful requests, queue plus compute"), "success"),
        (MetricFamily("nv_inference_queue_duration_us", "counter",
                      "Cumulative time requests waited in queues"), "queue"),
        (MetricFamily("nv_inference_compute_input_duration_us", "counter",
                      "Cumulative time requests spent copying inputs in"), "compute_input"),
        (MetricFamily("nv_inference_compute_infer_duration_us", "counter",
                      "Cumulative time requests spent in the model"), "compute_infer"),
        (MetricFamily("nv_inference_compute_output_duration_us", "counter",
                      "Cumulative time requests spent copying outputs out"), "compute_output"),
    ]
    rejected = MetricFamily("evenflow_rejected_requests_total", "counter",
                            "Requests refused at admission, by reason (queue_full, deadline, "
                            "latency_target, queue_delay)")
    dropped = MetricFamily("evenflow_dropped_requests_total", "counter",
                           "Admitted requests that never ran, by reason (deadline, cancelled)")
    target = MetricFamily("evenflow_latency_target_seconds", "gauge",
                          "Latency target the batch-size controllers aim for")
    replica_families = [(MetricFamily(name, kind, text), value)
                        for name, kind, text, value in _REPLICA_METRICS]
    where = MetricFamily("evenflow_replica_info", "gauge",
                         "1 per replica; ``location`` says where its worker runs (a worker "
                         "process's pid, a Ray node; empty in the engine process)")
    batch_sizes = MetricFamily("evenflow_replica_batches_by_size_total", "counter",
                               "Batches the replica has run, by batch size")
    statistics: list[tuple[str, ModelStatistics]] = []
    for model in models:
        labels = {"model": model.name, "version": MODEL_VERSION}
        stats = model.balancer.statistics()
        statistics.append((model.name, stats))
        snapshot = model.balancer.snapshot()
        success.add(stats.success.count, **labels)
        failure.add(stats.fail.count, **labels)
        count.add(stats.inference_count, **labels)
        exec_count.add(stats.execution_count, **labels)
        pending.add(snapshot.queued_requests, **labels)
        for family, attribute in durations:
            family.add(getattr(stats, attribute).total_s * _US, **labels)
        for reason in REJECT_REASONS:  # every reason, zeros included, so rates start at 0
            rejected.add(snapshot.rejected_by_reason.get(reason, 0), model=model.name,
                         reason=reason)
        for reason in DROP_REASONS:
            dropped.add(snapshot.dropped_by_reason.get(reason, 0), model=model.name,
                        reason=reason)
        target.add(snapshot.latency_target_s, model=model.name)
        for replica in snapshot.replicas:
            replica_labels = {"model": model.name, "replica": replica.name,
                              "devices": ",".join(replica.devices)}
            for family, value in replica_families:
                family.add(value(replica), **replica_labels)
            for size, batches in sorted(replica.batch_size_counts.items()):
                batch_sizes.add(batches, **replica_labels, batch_size=str(size))
            where.add(1.0, **replica_labels, location=replica.location)
    latency = histogram(
        "evenflow_request_duration_seconds",
        "Latency of successful requests, admission to answer (queue plus batch)",
        ["model", "version"],
        [([name, MODEL_VERSION], list(stats.latency_buckets), stats.latency_total_s)
         for name, stats in statistics])
    return [success, failure, count, exec_count, pending, *(f for f, _ in durations), latency,
            rejected, dropped, target, *(f for f, _ in replica_families), batch_sizes, where,
            *_cpu_family(statistics)]


def _cpu_family(statistics: Iterable[tuple[str, ModelStatistics]]) -> list[MetricFamily]:
    """CPU seconds by part of the request path, for models that count them
    (``EVENFLOW_CPU_PARTS=1``); nothing otherwise."""
    counted = [(name, stats.cpu_seconds) for name, stats in statistics
               if stats.cpu_seconds is not None]
    if not counted:
        return []
    family = MetricFamily("evenflow_cpu_seconds_total", "counter",
                          "CPU seconds by part of the request path (EVENFLOW_CPU_PARTS=1)")
    for name, seconds_by_part in counted:
        for part, seconds in seconds_by_part.items():
            family.add(seconds, model=name, part=part)
    return [family]


def _failure_family(failures: Mapping[tuple[str, str], int]) -> MetricFamily:
    family = MetricFamily("evenflow_request_failures_total", "counter",
                          "Requests answered with an error, by model and gRPC status code")
    for (model, code), count in sorted(failures.items()):
        family.add(count, model=model, code=code)
    return family


def _gpu_families(samples: Iterable[GpuSample]) -> list[MetricFamily]:
    """Per GPU, each field NVML reads; one it cannot read on that GPU (utilization on a MIG
    instance, clocks on some boards) is left out, not exported as the 0 it holds, and so is
    every field of a stale reading (NVML stuck on the GPU): a gap, not a frozen line."""
    families = [(MetricFamily(name, "gauge", text), field, value)
                for name, text, field, value in _GPU_METRICS]
    stale = MetricFamily(_GPU_STALE, "gauge",
                         "1 while a sample is stuck in NVML and this GPU has not been read "
                         "since (its other metrics are left out meanwhile)")
    for sample in samples:
        stale.add(1.0 if sample.stale else 0.0, gpu=sample.name)
        if sample.stale:
            continue
        for family, field, value in families:
            if field not in sample.unsupported:
                family.add(value(sample), gpu=sample.name)
    return [*(family for family, _, _ in families), stale]


def _frontend_families(frontends: Iterable[FrontendState]) -> list[MetricFamily]:
    up = MetricFamily("evenflow_frontend_up", "gauge",
                      "1 while the front-end process serves the port (--frontends N)")
    restarts = MetricFamily("evenflow_frontend_restarts_total", "counter",
                            "Times the front-end process was restarted after it died")
    for state in frontends:
        up.add(1.0 if state.up else 0.0, frontend=str(state.index))
        restarts.add(state.restarts, frontend=str(state.index))
    return [up, restarts]


# Exported only under --placement auto (a server with --placement all has no placer).
_MOVES = "evenflow_placement_moves_total"
_REPLICAS = "evenflow_placement_replicas"
_DEMAND = "evenflow_model_demand_samples_per_second"
_DEMAND_REQUESTS = "evenflow_model_demand_requests_per_second"
_LONG_DEMAND = "evenflow_model_demand_long_samples_per_second"
_LONG_DEMAND_REQUESTS = "evenflow_model_demand_long_requests_per_second"
_DEVICE_MEMORY = "evenflow_placement_device_memory_bytes"
_DEVICE_RESERVED = "evenflow_placement_device_reserved_bytes"
_MODEL_MEMORY = "evenflow_model_replica_memory_bytes"
_MODEL_LOAD = "evenflow_model_replica_load_seconds"
PLACEMENT_METRIC_NAMES = frozenset({_MOVES, _REPLICAS, _DEMAND, _DEMAND_REQUESTS,
                                    _LONG_DEMAND, _LONG_DEMAND_REQUESTS, _DEVICE_MEMORY,
                                    _DEVICE_RESERVED, _MODEL_MEMORY, _MODEL_LOAD})


def _placement_families(placement: PlacementSnapshot | None) -> list[MetricFamily]:
    """Under ``--placement auto``: moves by kind, reason and outcome; replicas by model,
    device and state; each model's demand, footprint and load time; each device's memory
    for replicas and what they hold of it."""
    moves = MetricFamily(_MOVES, "counter",
                         "Placement moves (add, drop) by reason (plan, tuner, overflow, "
                         "demand) and outcome (done, failed, skipped)")
    replicas = MetricFamily(_REPLICAS, "gauge",
                            "Replicas placed, by model, device and state (loading, serving, "
                            "draining)")
    demand = MetricFamily(_DEMAND, "gauge",
                          "Samples per second reaching the model, refused ones too, over 2 s")
    demand_requests = MetricFamily(
        _DEMAND_REQUESTS, "gauge",
        "Requests per second reaching the model, refused ones too, over 2 s")
    long_demand = MetricFamily(
        _LONG_DEMAND, "gauge",
        "Samples per second reaching the model, refused ones too, a 30 s moving average")
    long_requests = MetricFamily(
        _LONG_DEMAND_REQUESTS, "gauge",
        "Requests per second reaching the model, refused ones too, a 30 s moving average")
    device_memory = MetricFamily(
        _DEVICE_MEMORY, "gauge",
        "Memory replicas may use on the device (declared, or measured at start); absent for a "
        "device that declares none")
    device_reserved = MetricFamily(
        _DEVICE_RESERVED, "gauge",
        "Memory held on the device by the replicas placed there (loading, serving, draining) "
        "and loads in progress")
    model_memory = MetricFamily(
        _MODEL_MEMORY, "gauge",
        "One replica's footprint: parameters, buffers and the activation peak at its largest "
        "batch")
    model_load = MetricFamily(_MODEL_LOAD, "gauge",
                              "How long the latest replica took to load and warm up")
    if placement is None:
        return []
    for memory in placement.devices:
        if memory.limited:
            device_memory.add(memory.memory_bytes, device=memory.device)
        device_reserved.add(max(memory.reserved_bytes, 0), device=memory.device)
    for footprint in placement.models:
        model_memory.add(footprint.memory_bytes, model=footprint.model)
        model_load.add(footprint.load_s, model=footprint.model)
    for key, count in sorted(placement.moves.items()):
        kind, reason, outcome = key.split("/")
        moves.add(count, kind=kind, reason=reason, outcome=outcome)
    for model, device, state in placement.replicas:
        replicas.add(1.0, model=model, device=device, state=state)
    for model, rate in sorted(placement.demand_per_s.items()):
        demand.add(rate, model=model)
    for model, rate in sorted(placement.requests_per_s.items()):
        demand_requests.add(rate, model=model)
    for model, rate in sorted(placement.long_demand_per_s.items()):
        long_demand.add(rate, model=model)
    for model, rate in sorted(placement.long_requests_per_s.items()):
        long_requests.add(rate, model=model)
    return [moves, replicas, demand, demand_requests, long_demand, long_requests,
            device_memory, device_reserved, model_memory, model_load]


def collect(models: Iterable[ServedModel], gpu_samples: Iterable[GpuSample],
            failures: Mapping[tuple[str, str], int],
            frontends: Iterable[FrontendState] = (),
            placement: PlacementSnapshot | None = None) -> list[MetricFamily | Metric]:
    """Every metric family, read now. ``failures``: (model, status code) -> failed requests,
    in every process; ``frontends``: the front-end processes, with ``--frontends N``;
    ``placement``: the placer's snapshot under ``--placement auto``."""
    models = list(models)
    return [*_model_families(models), _failure_family(failures), *_gpu_families(gpu_samples),
            *_frontend_families(frontends), *_placement_families(placement)]
