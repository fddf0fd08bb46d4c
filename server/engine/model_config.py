"""Model descriptions for the wire: ModelMetadata, Triton's ModelConfig subset, ModelStatistics."""

from __future__ import annotations

from evenflow.balancer.stats import DurationStat
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import model_config_pb2 as mc
from evenflow.server.edge.datatypes import WIRE_TYPES
from evenflow.server.edge.model_names import MODEL_VERSION
from evenflow.server.engine.served import ServedModel


def model_metadata(model: ServedModel) -> pb.ModelMetadataResponse:
    meta = pb.ModelMetadataResponse.TensorMetadata
    definition = model.definition
    return pb.ModelMetadataResponse(
        name=model.name, versions=[MODEL_VERSION], platform=definition.platform,
        inputs=[meta(name=t.name, datatype=t.datatype, shape=t.shape) for t in definition.inputs],
        outputs=[meta(name=t.name, datatype=t.datatype, shape=t.shape)
                 for t in definition.outputs])


def model_config(model: ServedModel) -> mc.ModelConfig:
    """Triton's convention: ``max_batch_size > 0`` and dims without the batch dimension."""
    config = model.balancer.config
    definition = model.definition
    return mc.ModelConfig(
        name=model.name, platform=definition.platform, backend="pytorch",
        max_batch_size=config.max_batch,
        input=[mc.ModelInput(name=t.name, data_type=WIRE_TYPES[t.datatype].config_type,
                             dims=t.shape[1:]) for t in definition.inputs],
        output=[mc.ModelOutput(name=t.name, data_type=WIRE_TYPES[t.datatype].config_type,
                               dims=t.shape[1:]) for t in definition.outputs],
        instance_group=[mc.ModelInstanceGroup(name=r.name, count=1)
                        for r in model.balancer.snapshot().replicas],
        dynamic_batching=mc.ModelDynamicBatching(
            max_queue_delay_microseconds=round(config.max_wait_s * 1e6),
            # Levels as the balancer counts them: ``level_of`` is 0-based, the wire 1-based.
            priority_levels=config.priority_levels,
            default_priority_level=config.level_of(0) + 1),
        parameters={"evenflow_policy": mc.ModelParameter(string_value=config.policy.value)})


def _duration(stat: DurationStat) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=stat.count, ns=round(stat.total_s * 1e9))


def model_statistics(model: ServedModel) -> pb.ModelStatistics:
    stats = model.balancer.statistics()
    return pb.ModelStatistics(
        name=model.name, version=MODEL_VERSION,
        last_inference=round(stats.last_inference_s * 1000),
        inference_count=stats.inference_count, execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(stats.success), fail=_duration(stats.fail),
            queue=_duration(stats.queue), compute_input=_duration(stats.compute_input),
            compute_infer=_duration(stats.compute_infer),
            compute_output=_duration(stats.compute_output)),
        batch_stats=[pb.InferBatchStatistics(
            batch_size=size, compute_input=_duration(stat.compute_input),
            compute_infer=_duration(stat.compute_infer),
            compute_output=_duration(stat.compute_output))
            for size, stat in sorted(stats.batches.items())])
