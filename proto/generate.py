"""Generate the protobuf and gRPC modules from the .proto sources in this folder.

The .proto files are the one source of truth; the generated modules are committed so that
installing evenflow needs no code generator. ``python -m evenflow.proto.generate --check``
(run by the test suite) fails when a committed module differs from what the sources give.

grpc_tools writes flat imports (``import model_config_pb2``); they are rewritten to package
imports so that the modules live inside ``evenflow.proto``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
SOURCES = ("model_config.proto", "grpc_service.proto", "evenflow.proto")
_FLAT_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every source into ``out_dir``; returns the generated files."""
    from grpc_tools import protoc  # dev dependency, imported only when generating

    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(PROTO_DIR / name) for name in SOURCES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    generated = sorted(p for p in out_dir.iterdir() if p.suffix in (".py", ".pyi"))
    for path in generated:
        text = _FLAT_IMPORT.sub(r"from evenflow.proto import \1 as \2", path.read_text())
        path.write_text(text)
    return generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed modules are stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stale: list[str] = []
        for path in generate(Path(tmp)):
            target = PROTO_DIR / path.name
            fresh = path.read_text()
            if target.exists() and target.read_text() == fresh:
                continue
            if args.check:
                stale.append(path.name)
            else:
                target.write_text(fresh)
                print(f"wrote {target}")
    if stale:
        print(f"stale generated modules: {', '.join(stale)}; run python -m evenflow.proto.generate",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
