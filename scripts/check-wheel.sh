#!/usr/bin/env bash
# Builds the sdist and, from it, the wheel; installs the wheel into a fresh venv (not editable,
# outside the source tree, so nothing here can shadow a file the wheel forgot) and runs
# `evenflow demo` from it. Fails on any warning the build or the install prints (the
# machine's own "WARNING: Location ... is ignored" lines aside).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

quiet_warnings() {  # $1: log file; fails when it holds a warning that is ours
  if grep -i "warn" "$1" | grep -v "WARNING: Location" | grep -v "byte-compiling is disabled"; then
    echo "check-wheel: warnings above came from $2" >&2
    return 1
  fi
}

"$python" -m venv "$work/build-env"
"$work/build-env/bin/python" -m pip install -q build >"$work/pip-build.log" 2>&1
"$work/build-env/bin/python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
quiet_warnings "$work/build.log" "building the sdist and wheel"
ls "$work/dist"

"$python" -m venv "$work/venv"
# --no-compile: this venv serves one demo, and byte-compiling torch's files at install took
# over half of the install (38 s of it on a 2-core CI machine, 16 s without).
pip="$work/venv/bin/python -m pip"
$pip install -q --no-compile "torch==${EVENFLOW_TORCH_VERSION:-2.13.0}" >"$work/pip-torch.log" 2>&1 \
  || { cat "$work/pip-torch.log"; exit 1; }
$pip install --no-compile "$work"/dist/evenflow-*.whl >"$work/pip.log" 2>&1 \
  || { cat "$work/pip.log"; exit 1; }
quiet_warnings "$work/pip.log" "installing the wheel"
cd "$work"
"$work/venv/bin/evenflow" demo --port 0 --requests 50
echo "check-wheel: the wheel installs cleanly and serves"
