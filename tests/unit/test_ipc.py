"""What crosses between processes: arrays as frames, errors by name, forwarded calls."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from evenflow.balancer import (
    BatchFailed,
    DeviceNotFound,
    EvenflowError,
    InvalidRequest,
    ModelNotFound,
    OutOfMemory,
    ShuttingDown,
    WorkerLost,
)
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge.status import answers_errors
from evenflow.server.engine.proxied_calls import ProxiedCalls
from evenflow.server.processes.ipc import arrays, frontend_messages, worker_messages
from evenflow.server.processes.ipc.errors import from_wire, to_wire

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2],  # not contiguous
    np.zeros((0, 4), np.float16),  # empty
    np.array([True, False]),
    np.array([[b"ab", b""], [b"\x00c", b"d"]], dtype=object),  # BYTES: no raw buffer
], ids=["fp32", "strided", "empty", "bool", "bytes"])
def test_arrays_cross_as_frames_and_come_back_equal(array: np.ndarray) -> None:
    metas: list[arrays.ArrayMeta] = []
    frames: list[object] = []
    arrays.pack([array], metas, frames)
    header = worker_messages.encoder.encode(worker_messages.RunBatch(id=1, sizes=[1],
                                                                     arrays=metas))
    decoded = worker_messages.to_worker.decode(header)
    assert isinstance(decoded, worker_messages.RunBatch)
    received = [bytes(frame) for frame in frames]  # type: ignore[call-overload]
    (back,) = arrays.unpack(decoded.arrays, received)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_a_contiguous_array_is_sent_without_a_copy() -> None:
    array = np.arange(1 << 16, dtype=np.float32)
    frames: list[object] = []
    arrays.pack([array], [], frames)
    assert np.shares_memory(np.frombuffer(frames[0], np.float32), array)  # type: ignore[call-overload]


@pytest.mark.parametrize("error", [
    ModelNotFound("m"), InvalidRequest("bad"), OutOfMemory("oom"), WorkerLost("gone"),
    BatchFailed("raised"), DeviceNotFound("sim9"), EvenflowError("bug"), KeyError("sim3"),
    ValueError("speed"),
])
def test_errors_cross_by_name(error: Exception) -> None:
    back = from_wire(to_wire(error))
    assert type(back) is type(error)
    assert str(back) == str(error)


def test_whether_a_request_ran_crosses_too() -> None:
    back = from_wire(to_wire(ShuttingDown("draining", not_run=True)))
    assert isinstance(back, ShuttingDown) and back.not_run
    lost = from_wire(to_wire(WorkerLost("lost while running")))
    assert isinstance(lost, WorkerLost) and not lost.not_run


def test_an_unknown_error_crosses_as_a_failed_batch_with_its_type() -> None:
    back = from_wire(to_wire(ZeroDivisionError("division by zero")))
    assert isinstance(back, BatchFailed)
    assert str(back) == "ZeroDivisionError: division by zero"


def test_frontend_messages_round_trip() -> None:
    message = frontend_messages.Infer(id=7, model="mlp", version="", num_samples=2,
                                      deadline_s=float("inf"), priority=1, arrays=[])
    assert frontend_messages.to_engine.decode(frontend_messages.encoder.encode(message)) == \
        message


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    @answers_errors
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        if request.name == "missing":
            raise ModelNotFound("unknown model 'missing'")
        if request.name == "bug":
            raise RuntimeError("a bug")
        return pb.ModelMetadataResponse(name=request.name, platform="test")


@pytest.fixture
def calls() -> ProxiedCalls:
    proxied = ProxiedCalls()
    proxied.add(pb_grpc.add_GRPCInferenceServiceServicer_to_server, _Servicer())
    return proxied


_METADATA = "/inference.GRPCInferenceService/ModelMetadata"


async def test_a_forwarded_call_runs_the_servicer_and_returns_its_bytes(
        calls: ProxiedCalls) -> None:
    code, details, response = await calls.call(
        _METADATA, pb.ModelMetadataRequest(name="m").SerializeToString(), float("inf"))
    assert (code, details) == (0, "")
    assert pb.ModelMetadataResponse.FromString(response).platform == "test"


@pytest.mark.parametrize(("name", "status", "details"), [
    ("missing", grpc.StatusCode.NOT_FOUND, "unknown model 'missing'"),
    ("bug", grpc.StatusCode.INTERNAL, "internal server error (RuntimeError)"),
])
async def test_a_forwarded_call_answers_errors_with_their_status(
        calls: ProxiedCalls, name: str, status: grpc.StatusCode, details: str) -> None:
    code, message, _ = await calls.call(
        _METADATA, pb.ModelMetadataRequest(name=name).SerializeToString(), float("inf"))
    assert code == status.value[0]
    assert details in message


async def test_unimplemented_and_unknown_methods_say_so(calls: ProxiedCalls) -> None:
    code, _, _ = await calls.call("/inference.GRPCInferenceService/ServerLive",
                                  pb.ServerLiveRequest().SerializeToString(), float("inf"))
    assert code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    code, _, _ = await calls.call("/no.Such/Method", b"", float("inf"))
    assert code == grpc.StatusCode.UNIMPLEMENTED.value[0]
