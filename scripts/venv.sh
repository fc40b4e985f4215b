#!/usr/bin/env bash
# Create .venv (python3 only) and install a requirements file into it; reinstall only when the
# requirements change, so repeated runs start fast. Usage: scripts/venv.sh requirements-dev.txt
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
requirements="$root/${1:-requirements.txt}"
venv="$root/.venv"
stamp="$venv/.installed-$(basename "$requirements")"
digest=$(cat "$root/requirements.txt" "$requirements" | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$digest" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  echo "$digest" > "$stamp"
fi
