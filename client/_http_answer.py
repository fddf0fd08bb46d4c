"""An HTTP answer as either transport reads it, and what it means: outputs, metadata, a
health verdict or the error the gRPC path would raise."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np

from evenflow.client import _rest_codec as rest
from evenflow.client._retry import not_run
from evenflow.client.errors import InferenceServerError, error_for

_REFUSED = (401, 403)  # the token: an error, not a "no"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    header_length: str | None  # Inference-Header-Content-Length, when binary data follows
    reason: str
    status_name: str | None = None  # evenflow-status: the gRPC status an error stands for
    # evenflow-may-resend: an error for a request the server did not run (``_retry``)
    may_resend: bool = False

    def error(self) -> InferenceServerError:
        error = rest.error_of(self.status, self.body, self.reason, self.status_name)
        return not_run(error) if self.may_resend else error

    def body_or_raise(self) -> bytes:
        if self.status != 200:
            raise self.error()
        return self.body

    def outputs(self) -> dict[str, np.ndarray]:
        return rest.parse_response(self.body_or_raise(), self.header_length)


def health(answer: Answer) -> bool:
    """KServe v2's health and readiness answer in the status: 200 is yes, anything else no
    (4xx, or 503 from a server that is draining), except a refused token, which raises."""
    if answer.status in _REFUSED:
        raise answer.error()
    return answer.status == 200


def too_large(size_bytes: int, limit_bytes: int) -> InferenceServerError:
    # gRPC refuses an over-long message with RESOURCE_EXHAUSTED too.
    return error_for(grpc.StatusCode.RESOURCE_EXHAUSTED,
                     f"answer of {size_bytes} bytes is over max_message_bytes ({limit_bytes})")
