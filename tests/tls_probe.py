"""Calls a TLS server with Triton's client: ``python tests/tls_probe.py URL CA CERT KEY TOKEN``.

Prints one line per case, ``case: OK`` or ``case: <status>``; a separate process because
tritonclient's protos share our ``inference`` names. CERT and KEY may be ``-`` (no client
certificate); TOKEN may be ``-`` (no authorization header).
"""

from __future__ import annotations

import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def main() -> None:
    url, ca, cert, key, token = sys.argv[1:6]
    client = grpcclient.InferenceServerClient(
        url, ssl=True, root_certificates=ca,
        private_key=None if key == "-" else key,
        certificate_chain=None if cert == "-" else cert)
    headers = None if token == "-" else {"authorization": f"Bearer {token}"}
    x = np.ones((1, 256), np.float32)
    tensor = grpcclient.InferInput("x", [1, 256], "FP32")
    tensor.set_data_from_numpy(x)
    try:
        y = client.infer("mlp", [tensor], headers=headers).as_numpy("y")
        assert y is not None and y.shape == (1, 256)
        print("infer: OK")
    except InferenceServerException as exc:
        print(f"infer: {exc.status()}")
    client.close()


if __name__ == "__main__":
    main()
