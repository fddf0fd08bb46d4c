from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatsRequest(_message.Message):
    __slots__ = ("model_name",)
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    def __init__(self, model_name: _Optional[str] = ...) -> None: ...

class ReplicaStats(_message.Message):
    __slots__ = ("name", "devices", "busy_fraction", "queued_requests", "queued_samples", "outstanding_work_s", "batch_size", "fit_base_s", "fit_per_sample_s", "fit_reliable", "num_batches", "num_samples", "batch_size_counts", "busy_s", "num_stolen_requests", "running_requests", "stages", "num_repartitions", "healthy", "restarts", "location", "unusable_reason", "num_requests", "turn_wait_s")
    class BatchSizeCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    BUSY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_WORK_S_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    FIT_BASE_S_FIELD_NUMBER: _ClassVar[int]
    FIT_PER_SAMPLE_S_FIELD_NUMBER: _ClassVar[int]
    FIT_RELIABLE_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCHES_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    NUM_STOLEN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_REPARTITIONS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    UNUSABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TURN_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    busy_fraction: float
    queued_requests: int
    queued_samples: int
    outstanding_work_s: float
    batch_size: int
    fit_base_s: float
    fit_per_sample_s: float
    fit_reliable: bool
    num_batches: int
    num_samples: int
    batch_size_counts: _containers.ScalarMap[int, int]
    busy_s: float
    num_stolen_requests: int
    running_requests: int
    stages: _containers.RepeatedCompositeFieldContainer[PipelineStage]
    num_repartitions: int
    healthy: bool
    restarts: int
    location: str
    unusable_reason: str
    num_requests: int
    turn_wait_s: float
    def __init__(self, name: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., busy_fraction: _Optional[float] = ..., queued_requests: _Optional[int] = ..., queued_samples: _Optional[int] = ..., outstanding_work_s: _Optional[float] = ..., batch_size: _Optional[int] = ..., fit_base_s: _Optional[float] = ..., fit_per_sample_s: _Optional[float] = ..., fit_reliable: _Optional[bool] = ..., num_batches: _Optional[int] = ..., num_samples: _Optional[int] = ..., batch_size_counts: _Optional[_Mapping[int, int]] = ..., busy_s: _Optional[float] = ..., num_stolen_requests: _Optional[int] = ..., running_requests: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[PipelineStage, _Mapping]]] = ..., num_repartitions: _Optional[int] = ..., healthy: _Optional[bool] = ..., restarts: _Optional[int] = ..., location: _Optional[str] = ..., unusable_reason: _Optional[str] = ..., num_requests: _Optional[int] = ..., turn_wait_s: _Optional[float] = ...) -> None: ...

class PipelineStage(_message.Message):
    __slots__ = ("device", "first_layer", "last_layer", "planned_s", "measured_s", "memory_bytes")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    FIRST_LAYER_FIELD_NUMBER: _ClassVar[int]
    LAST_LAYER_FIELD_NUMBER: _ClassVar[int]
    PLANNED_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    device: str
    first_layer: int
    last_layer: int
    planned_s: float
    measured_s: float
    memory_bytes: int
    def __init__(self, device: _Optional[str] = ..., first_layer: _Optional[int] = ..., last_layer: _Optional[int] = ..., planned_s: _Optional[float] = ..., measured_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class ModelBalancerStats(_message.Message):
    __slots__ = ("model_name", "policy", "batch_policy", "latency_target_s", "replicas", "queued_requests", "num_rejected", "rejected_by_reason", "dropped_by_reason")
    class RejectedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DroppedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BATCH_POLICY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_TARGET_S_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_REJECTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    policy: str
    batch_policy: str
    latency_target_s: float
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStats]
    queued_requests: int
    num_rejected: int
    rejected_by_reason: _containers.ScalarMap[str, int]
    dropped_by_reason: _containers.ScalarMap[str, int]
    def __init__(self, model_name: _Optional[str] = ..., policy: _Optional[str] = ..., batch_policy: _Optional[str] = ..., latency_target_s: _Optional[float] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStats, _Mapping]]] = ..., queued_requests: _Optional[int] = ..., num_rejected: _Optional[int] = ..., rejected_by_reason: _Optional[_Mapping[str, int]] = ..., dropped_by_reason: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DeviceStats(_message.Message):
    __slots__ = ("name", "utilization", "memory_used_bytes", "memory_total_bytes", "sm_clock_mhz", "throttle_reasons", "temperature_c", "unsupported", "stale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    UNSUPPORTED_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    sm_clock_mhz: int
    throttle_reasons: int
    temperature_c: int
    unsupported: _containers.RepeatedScalarFieldContainer[str]
    stale: bool
    def __init__(self, name: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., sm_clock_mhz: _Optional[int] = ..., throttle_reasons: _Optional[int] = ..., temperature_c: _Optional[int] = ..., unsupported: _Optional[_Iterable[str]] = ..., stale: _Optional[bool] = ...) -> None: ...

class PlacedReplica(_message.Message):
    __slots__ = ("model", "device", "state")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: str
    state: str
    def __init__(self, model: _Optional[str] = ..., device: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class PlacementMove(_message.Message):
    __slots__ = ("at_s", "kind", "model", "device", "reason", "took_s", "outcome")
    AT_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOOK_S_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    at_s: float
    kind: str
    model: str
    device: str
    reason: str
    took_s: float
    outcome: str
    def __init__(self, at_s: _Optional[float] = ..., kind: _Optional[str] = ..., model: _Optional[str] = ..., device: _Optional[str] = ..., reason: _Optional[str] = ..., took_s: _Optional[float] = ..., outcome: _Optional[str] = ...) -> None: ...

class PlacementDevice(_message.Message):
    __slots__ = ("device", "memory_bytes", "reserved_bytes")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    device: str
    memory_bytes: int
    reserved_bytes: int
    def __init__(self, device: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ...) -> None: ...

class PlacementModel(_message.Message):
    __slots__ = ("model", "memory_bytes", "load_s")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    model: str
    memory_bytes: int
    load_s: float
    def __init__(self, model: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., load_s: _Optional[float] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("mode", "replicas", "moves", "recent", "demand_per_s", "requests_per_s", "devices", "models", "long_demand_per_s", "long_requests_per_s")
    class MovesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DemandPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class RequestsPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LongDemandPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LongRequestsPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    DEMAND_PER_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LONG_DEMAND_PER_S_FIELD_NUMBER: _ClassVar[int]
    LONG_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    mode: str
    replicas: _containers.RepeatedCompositeFieldContainer[PlacedReplica]
    moves: _containers.ScalarMap[str, int]
    recent: _containers.RepeatedCompositeFieldContainer[PlacementMove]
    demand_per_s: _containers.ScalarMap[str, float]
    requests_per_s: _containers.ScalarMap[str, float]
    devices: _containers.RepeatedCompositeFieldContainer[PlacementDevice]
    models: _containers.RepeatedCompositeFieldContainer[PlacementModel]
    long_demand_per_s: _containers.ScalarMap[str, float]
    long_requests_per_s: _containers.ScalarMap[str, float]
    def __init__(self, mode: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[PlacedReplica, _Mapping]]] = ..., moves: _Optional[_Mapping[str, int]] = ..., recent: _Optional[_Iterable[_Union[PlacementMove, _Mapping]]] = ..., demand_per_s: _Optional[_Mapping[str, float]] = ..., requests_per_s: _Optional[_Mapping[str, float]] = ..., devices: _Optional[_Iterable[_Union[PlacementDevice, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[PlacementModel, _Mapping]]] = ..., long_demand_per_s: _Optional[_Mapping[str, float]] = ..., long_requests_per_s: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("uptime_s", "models", "devices", "placement")
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    uptime_s: float
    models: _containers.RepeatedCompositeFieldContainer[ModelBalancerStats]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStats]
    placement: Placement
    def __init__(self, uptime_s: _Optional[float] = ..., models: _Optional[_Iterable[_Union[ModelBalancerStats, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[DeviceStats, _Mapping]]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class SetDeviceSpeedRequest(_message.Message):
    __slots__ = ("device", "speed")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    device: str
    speed: float
    def __init__(self, device: _Optional[str] = ..., speed: _Optional[float] = ...) -> None: ...

class SetDeviceSpeedResponse(_message.Message):
    __slots__ = ("previous_speed",)
    PREVIOUS_SPEED_FIELD_NUMBER: _ClassVar[int]
    previous_speed: float
    def __init__(self, previous_speed: _Optional[float] = ...) -> None: ...

class SetDeviceFaultRequest(_message.Message):
    __slots__ = ("device", "fault", "count")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    device: str
    fault: str
    count: int
    def __init__(self, device: _Optional[str] = ..., fault: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class SetDeviceFaultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
