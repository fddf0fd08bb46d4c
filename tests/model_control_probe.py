"""Drives model control with Triton's own client, over gRPC or HTTP:
``python tests/model_control_probe.py URL [grpc|http]``.

Run as a separate process (tritonclient's protos share our ``inference`` names). Expects a server
configured with models ``stays`` and ``goes`` loaded and ``later`` named but not loaded. Prints
one line per step; exits non-zero at the first surprise. The two clients share this API; they
differ in the index's shape and in the status an error carries.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROTOCOL = sys.argv[2] if len(sys.argv) > 2 else "grpc"
triton: Any = httpclient if PROTOCOL == "http" else grpcclient


def states(client: Any) -> dict[str, str]:
    if PROTOCOL == "http":
        models = client.get_model_repository_index()
    else:
        models = client.get_model_repository_index(as_json=True).get("models", [])
    return {m["name"]: m.get("state", "") for m in models}


def infer(client: Any, model: str) -> np.ndarray:
    x = np.ones((2, 256), np.float32)
    tensor = triton.InferInput("x", [2, 256], "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy("y")


def refused(call: object, *args: object, **kwargs: object) -> str:
    try:
        call(*args, **kwargs)  # type: ignore[operator]
    except InferenceServerException as exc:
        return str(exc.status())
    raise AssertionError(f"{call} {args} {kwargs} was not refused")


def main() -> None:
    client = triton.InferenceServerClient(sys.argv[1])
    metadata = client.get_server_metadata() if PROTOCOL == "http" \
        else client.get_server_metadata(as_json=True)
    assert "model_repository" in metadata["extensions"]
    before = states(client)
    assert before == {"stays": "READY", "goes": "READY", "later": "UNAVAILABLE"}, before
    print("index before:", before)
    assert not client.is_model_ready("later")
    client.load_model("later")
    assert client.is_model_ready("later")
    np.testing.assert_array_equal(infer(client, "later"), np.ones((2, 256), np.float32))
    print("loaded later and called it")
    client.unload_model("goes")
    assert not client.is_model_ready("goes")
    print("unloaded goes; calling it now:", refused(infer, client, "goes"))
    after = states(client)
    assert after == {"stays": "READY", "goes": "UNAVAILABLE", "later": "READY"}, after
    print("index after:", after)
    print("unknown model:", refused(client.load_model, "nosuch"))
    print("other source:", refused(client.load_model, "later", config='{"source": "mlp"}'))
    print("unload twice:", refused(client.unload_model, "goes"))
    client.load_model("goes")  # back again
    assert client.is_model_ready("goes")
    client.close()
    print(f"model control probe ({PROTOCOL}): ok")


if __name__ == "__main__":
    main()
