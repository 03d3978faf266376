#!/usr/bin/env bash
# Print the README's test command: the one line of the first ```bash block under "## Tests".
# .ci/run and scripts/newcomer_check.sh run what this prints, so README and CI cannot drift.
set -euo pipefail
readme="${1:-$(dirname "$0")/../README.md}"
cmd=$(awk '/^## Tests/{t=1} t&&/^```bash/{b=1;next} b&&/^```/{exit} b{print}' "$readme")
if [ -z "$cmd" ] || [ "$(printf '%s\n' "$cmd" | wc -l)" -ne 1 ]; then
  echo "error: $readme: no one-line command in the first bash block under '## Tests'" >&2
  echo "hint: keep the README's test command on one line" >&2
  exit 2
fi
printf '%s\n' "$cmd"
