"""Drives model control with Triton's own client: ``python tests/model_control_probe.py URL``.

Run as a separate process (tritonclient's protos share our ``inference`` names). Expects a server
configured with models ``stays`` and ``goes`` loaded and ``later`` named but not loaded. Prints
one line per step; exits non-zero at the first surprise.
"""

from __future__ import annotations

import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def states(client: grpcclient.InferenceServerClient) -> dict[str, str]:
    index = client.get_model_repository_index(as_json=True)
    return {m["name"]: m.get("state", "") for m in index.get("models", [])}


def infer(client: grpcclient.InferenceServerClient, model: str) -> np.ndarray:
    x = np.ones((2, 256), np.float32)
    tensor = grpcclient.InferInput("x", [2, 256], "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy("y")


def refused(call: object, *args: object, **kwargs: object) -> str:
    try:
        call(*args, **kwargs)  # type: ignore[operator]
    except InferenceServerException as exc:
        return str(exc.status())
    raise AssertionError(f"{call} {args} {kwargs} was not refused")


def main() -> None:
    client = grpcclient.InferenceServerClient(sys.argv[1])
    assert "model_repository" in client.get_server_metadata(as_json=True)["extensions"]
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
    print("model control probe: ok")


if __name__ == "__main__":
    main()
