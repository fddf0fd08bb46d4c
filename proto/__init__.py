"""The wire contract: KServe v2 inference service, Triton's ModelConfig subset, evenflow's own
stats and admin services. Generated modules (``*_pb2*.py``) come from the ``.proto`` files here
through ``python -m evenflow.proto.generate``."""
