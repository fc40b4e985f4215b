"""``lint``: the permission annotations of Role and ClusterRole manifests, compiled as the
webhook compiles them, one line per role."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from app.cli.inputs import policy_settings
from app.engine.kinds import ROLE_KINDS
from app.source.static import ManifestError, read_manifests


def cmd_lint(args: argparse.Namespace) -> int:
    compiler = policy_settings(args).compiler
    try:
        objects = read_manifests(*args.files)
    except (OSError, ManifestError) as exc:
        print(f"lint: {exc}", file=sys.stderr)
        return 2
    role_kinds = {spec.kind: spec for spec in ROLE_KINDS}
    roles = [
        (_manifest_name(kind, obj), role_kinds[kind].compile(compiler, obj))
        for kind, obj in objects
        if kind in role_kinds
    ]
    if not roles:
        print("lint: no Role or ClusterRole found", file=sys.stderr)
        return 2
    for name, role in roles:
        if role.error is not None:
            print(f"invalid: {name}: {role.error}")
        else:
            entries = len(role.permissions.entries) if role.permissions else 0
            print(f"ok: {name} ({entries} permission entr{'y' if entries == 1 else 'ies'})")
    return 1 if any(role.error is not None for _, role in roles) else 0


def _manifest_name(kind: str, obj: Mapping[str, Any]) -> str:
    """``role t1/x``, ``role x`` (no namespace in the file yet), ``clusterrole x``, as written."""
    meta = obj.get("metadata")
    name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
    namespace = meta.get("namespace") if isinstance(meta, Mapping) and kind == "Role" else None
    return f"{kind.lower()} {f'{namespace}/' if namespace else ''}{name or '(no name)'}"
