#!/usr/bin/env bash
# Creates .venv and installs evenflow (a regular install: the tests run what the wheel ships;
# for an editable install, `.venv/bin/pip install -e .`) with its test and load-test tools.
#   --perf-analyzer   also installs Triton's perf_analyzer binary into .tools/ (see README)
# torch goes in first, pinned, so that pip never resolves a multi-GB CUDA build of it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
pip install -q --upgrade pip
pip install -q "torch==${EVENFLOW_TORCH_VERSION:-2.13.0}"
pip install -q ".[${EVENFLOW_EXTRAS:-dev}]"  # CI adds the ray extra: EVENFLOW_EXTRAS=dev,ray
.venv/bin/python -c "import evenflow.server.engine.app, tritonclient.grpc" >/dev/null 2>&1 \
  || .venv/bin/python -c "import evenflow.server.engine.app"  # fail loudly if the install is broken

if [ "${1:-}" = "--perf-analyzer" ]; then
  # perf_analyzer ships inside tritonclient wheels up to 2.51.0; installed apart, without
  # dependencies, because that tritonclient pins protobuf < 5.
  tools=.tools/perf_analyzer
  if [ ! -x "$tools/bin/perf_analyzer" ]; then
    pip install -q --no-deps --target "$tools" "tritonclient[grpc]==2.51.0" nvidia-cuda-runtime-cu12
  fi
  lib="$PWD/$tools/nvidia/cuda_runtime/lib"
  if LD_LIBRARY_PATH="$lib" ldd "$tools/bin/perf_analyzer" | grep -q "not found"; then
    # Its one missing system library on Debian; needs root (CI runs as root).
    (apt-get install -y -q -o DPkg::Lock::Timeout=600 libb64-0d >/dev/null 2>&1 \
      || (apt-get update -q -o DPkg::Lock::Timeout=600 >/dev/null 2>&1 \
          && apt-get install -y -q -o DPkg::Lock::Timeout=600 libb64-0d >/dev/null 2>&1)) \
      || echo "setup: could not install libb64-0d; perf_analyzer tests will skip" >&2
  fi
  mkdir -p .tools/bin
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
    "$lib" "$PWD/$tools/bin/perf_analyzer" > .tools/bin/perf_analyzer
  chmod +x .tools/bin/perf_analyzer
  if .tools/bin/perf_analyzer --version >/dev/null 2>&1; then
    echo "setup: perf_analyzer ready at .tools/bin/perf_analyzer"
  else
    rm -f .tools/bin/perf_analyzer
    echo "setup: perf_analyzer does not run here; its tests will skip" >&2
  fi
fi
