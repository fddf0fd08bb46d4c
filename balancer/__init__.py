"""Scheduling policy and mechanism: admission, routing, batching, batch-size control, latency
estimation. Imports neither grpc nor torch; drives workers through ``Worker``."""

from evenflow.balancer.balancer import ModelBalancer
from evenflow.balancer.config import BalancerConfig
from evenflow.balancer.controller import BatchSizeController, best_batch_size
from evenflow.balancer.errors import (
    BatchFailed,
    DeadlineExceeded,
    DeviceLost,
    DeviceNotFound,
    ErrorCode,
    EvenflowError,
    InvalidRequest,
    ModelNotFound,
    OutOfMemory,
    Overloaded,
    ShuttingDown,
    WorkerLost,
)
from evenflow.balancer.estimator import LatencyFit, LatencyModel
from evenflow.balancer.job import (
    BatchResult,
    BatchTiming,
    Clock,
    Job,
    SingleDeviceWorker,
    Worker,
    WorkerStatus,
)
from evenflow.balancer.policies import Policy, ReplicaLoad
from evenflow.balancer.stats import BalancerSnapshot, ReplicaSnapshot
from evenflow.balancer.timebase import LoopTime, TimeSource

__all__ = [
    "BalancerConfig", "BalancerSnapshot", "BatchFailed", "BatchResult", "BatchSizeController",
    "BatchTiming", "Clock", "DeadlineExceeded", "DeviceLost", "DeviceNotFound", "ErrorCode",
    "EvenflowError", "InvalidRequest", "Job", "LatencyFit", "LatencyModel", "LoopTime",
    "ModelBalancer", "ModelNotFound", "OutOfMemory", "Overloaded", "Policy", "ReplicaLoad",
    "ReplicaSnapshot", "ShuttingDown", "SingleDeviceWorker", "TimeSource", "Worker",
    "WorkerLost", "WorkerStatus",
    "best_batch_size",
]
