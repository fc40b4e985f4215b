#!/usr/bin/env bash
# Create .venv (python3 only) and install the hash-locked runtime dependencies and a requirements
# file into it; reinstall only when they change, so repeated runs start fast.
# Usage: scripts/venv.sh requirements-dev.txt
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
requirements="$root/${1:-requirements.txt}"
venv="$root/.venv"
stamp="$venv/.installed-$(basename "$requirements")"
digest=$(cat "$root/requirements.lock" "$root/requirements.txt" "$requirements" | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$digest" ]; then
  # The runtime dependencies from the lock, every file checked against its hash (as the image
  # installs them); then the requested file, whose runtime pins the lock already satisfies.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes \
    --no-deps -r "$root/requirements.lock"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  echo "$digest" > "$stamp"
fi
