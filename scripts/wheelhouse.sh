#!/usr/bin/env bash
# Downloads, into one folder, every wheel a GPU host without network needs to install evenflow
# and run its GPU tests and `python -m benchmarks.gpu_check`, when the host already has torch,
# grpcio and protobuf (they are not downloaded), then builds evenflow's own wheel into it.
#   scripts/wheelhouse.sh [--python-version 3.12] [--grpcio 1.84] [--out wheelhouse]
# On the host: pip install --no-index --find-links wheelhouse 'evenflow[gpu-test]' (docs/gpu.md).
# The requirements come from pyproject.toml (dependencies and the gpu-test extra), so this list
# cannot drift from the package's. grpcio-health-checking and grpcio-reflection must match the
# host's grpcio: every patch release of the --grpcio series is downloaded, without dependencies,
# and pip on the host picks the newest that the installed grpcio satisfies.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=3.12
grpcio_series=1.84
out=wheelhouse
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) python_version=$2; shift 2 ;;
    --grpcio) grpcio_series=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--python-version X.Y] [--grpcio X.Y] [--out DIR]" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
mkdir -p "$out"
# torch, grpcio and protobuf are the host's; the grpcio plugins are pinned to its series below.
preinstalled='^(torch|grpcio|protobuf|grpcio-health-checking|grpcio-reflection)$'
requirements=$("$python" - "$preinstalled" <<'PY'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for requirement in [*project["dependencies"], *project["optional-dependencies"]["gpu-test"]]:
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    if not re.match(sys.argv[1], name.lower()):
        print(requirement)
PY
)
# The host's platform: manylinux wheels up to glibc 2.28 (torch's own floor), 64-bit x86.
target=(--python-version "$python_version" --implementation cp --only-binary=:all:
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
# pip's own failures stop the script; this machine's "Location ... is ignored" lines are dropped.
pip() { "$python" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); }
mapfile -t reqs <<<"$requirements"
pip download -q "${target[@]}" -d "$out" "${reqs[@]}"
for package in grpcio-health-checking grpcio-reflection; do
  for version in $("$python" -m pip index versions "$package" 2>/dev/null \
                   | sed -n 's/^Available versions: //p' | tr -d ' ' | tr ',' '\n' \
                   | grep -E "^${grpcio_series//./\\.}\.[0-9]+$"); do
    pip download -q --no-deps "${target[@]}" -d "$out" "$package==$version"
  done
done
if ! ls "$out"/grpcio_health_checking-"$grpcio_series".*.whl >/dev/null 2>&1; then
  echo "wheelhouse: PyPI has no grpcio-health-checking $grpcio_series.*" >&2
  exit 1
fi
# A dependency that pulled in one of the host's own packages would shadow or fight it there.
if ls "$out" | grep -E '^(torch|grpcio|protobuf)-' ; then
  echo "wheelhouse: the wheels above are preinstalled on the host and must not be here" >&2
  exit 1
fi
rm -f "$out"/evenflow-*.whl
pip wheel -q --no-deps -w "$out" .
ls "$out"/evenflow-*.whl >/dev/null
du -h "$out"/* | sort -k2
du -sh "$out"
