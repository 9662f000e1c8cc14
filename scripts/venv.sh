#!/usr/bin/env bash
# Creates (or refreshes) the pinned Python venv at .venv for fixture scripts.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv="${INSITU_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r "$here/scripts/requirements.txt"
echo "$venv"
