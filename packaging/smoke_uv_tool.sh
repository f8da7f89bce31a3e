#!/usr/bin/env bash
# `uv tool install` of the built wheel, CPU torch: the tool runs from its own bin folder, and no CUDA
# wheel (nvidia-*) came with it. uv itself is pip-installed into a throw-away venv (from PyPI).
#   packaging/smoke_uv_tool.sh [DIST_DIR]
# UV_TORCH_SOURCE: where the CPU torch comes from (default the CPU index; CI passes a local
# --find-links folder where the machine has one). The rest comes from PyPI.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dist="$(cd "${1:-$repo/dist}" && pwd)"
python="${PYTHON:-python3}"
wheels=("$dist"/kvinspect-*.whl)
[ -f "${wheels[0]}" ] || { echo "smoke_uv_tool: no kvinspect wheel in $dist (run python -m build)" >&2; exit 2; }
source_args="${UV_TORCH_SOURCE:---index https://download.pytorch.org/whl/cpu}"
work="$(mktemp -d -t kvinspect-uv-XXXXXX)"
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
unset PYTHONPATH
cd "$work"
"$python" -m venv uv-venv
uv-venv/bin/python -m pip install -q --no-compile uv
export UV_TOOL_DIR="$work/tools" UV_TOOL_BIN_DIR="$work/bin" UV_CACHE_DIR="$work/cache" UV_PYTHON_DOWNLOADS=never
# shellcheck disable=SC2086  # source_args holds uv options
uv-venv/bin/uv tool install -q --python "$python" "${wheels[0]}" --with 'torch==2.13.0+cpu' $source_args \
  --index-strategy unsafe-best-match
site="$(echo "$work"/tools/kvinspect/lib/python*/site-packages)"
if ls "$site" | grep -i '^nvidia'; then echo "smoke_uv_tool: the CPU install pulled CUDA wheels (above)" >&2; exit 1; fi
"$work/bin/kvinspect" --version
KVINSPECT_CONFIG_DIR="$work/config" "$work/bin/kvinspect" models >models.txt && grep -q tiny-llama models.txt
test -x "$work/bin/kvinspect-gui"
echo "smoke_uv_tool: ok ($(( $(date +%s) - t0 )) s)"
