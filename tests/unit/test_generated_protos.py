import pytest

pytest.importorskip("grpc_tools")

from evenflow.proto import generate


def test_generated_modules_match_the_proto_sources() -> None:
    assert generate.main(["--check"]) == 0, "run: python -m evenflow.proto.generate"
