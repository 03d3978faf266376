#!/usr/bin/env bash
# The README's test command as a newcomer meets it: a fresh clone of this repository's HEAD, a
# fresh venv, optionally without the Debian packages of .ci/apt-packages (--purge-apt removes them
# first, so the command must install them itself), then the command printed by
# scripts/readme_test_command.sh, timed. Run by hand before a stop; CI runs the same command in a
# fresh venv (.ci/run), but never purges the machine's packages (that would change the host CI
# runs on for every later run and session).
#   bash scripts/newcomer_check.sh [--purge-apt]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
purge=0
[ "${1:-}" = "--purge-apt" ] && purge=1
work=$(mktemp -d "${TMPDIR:-/tmp}/tfcompile-newcomer.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ "$purge" -eq 1 ]; then
  mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$repo/.ci/apt-packages")
  echo "newcomer: removing ${pkgs[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq "${pkgs[@]}" >/dev/null
fi
git clone -q "$repo" "$work/tfcompile"
[ -d "$repo/../shared" ] && cp -r "$repo/../shared" "$work/" 2>/dev/null || true
python3 -m venv "$work/venv"
cd "$work/tfcompile"
cmd=$(bash scripts/readme_test_command.sh)
echo "newcomer: $cmd  (in $work/tfcompile, venv $work/venv; $(uptime))" >&2
start=$(date +%s)
rc=0
(. "$work/venv/bin/activate" && env -u TFCOMPILE_ALLOW_SKIPS bash -c "$cmd") || rc=$?
echo "newcomer: exit $rc after $(( $(date +%s) - start )) s (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
exit "$rc"
