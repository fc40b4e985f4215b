"""``lint``: the permission annotations of Role and ClusterRole manifests, compiled as the
webhook compiles them; every problem of each role (the webhook stops at the first), as lines or
``-o json``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from app.cli.inputs import policy_settings
from app.engine.kinds import ROLE_KINDS
from app.engine.model import MODES
from app.engine.placement import placement_errors, placement_warnings
from app.engine.policy import annotation_errors
from app.engine.rbac import MODE_ANNOTATION, CompiledRole, Compiler, annotations_of
from app.source.static import ManifestError, read_manifests


def role_errors(compiler: Compiler, role: CompiledRole, obj: Mapping[str, Any]) -> list[str]:
    """Every problem of one compiled role: its rules or metadata, each of its annotation's, and
    its mode annotation's."""
    if role.error is None:
        return []
    if role.error.startswith("malformed "):
        return [role.error]  # nothing further is read from a role whose rules cannot be
    annotations = annotations_of(obj)
    found = annotation_errors(annotations, compiler.annotation_keys, compiler.default_label_key)
    found += placement_errors(annotations, compiler.placement_keys)
    mode = annotations.get(MODE_ANNOTATION)
    if mode is not None and mode not in MODES:
        found.append(
            f"invalid {MODE_ANNOTATION} annotation {mode!r}: expected one of {', '.join(MODES)}"
        )
    return found or [role.error]


def cmd_lint(args: argparse.Namespace) -> int:
    compiler = policy_settings(args).compiler
    try:
        objects = read_manifests(*args.files)
    except (OSError, ManifestError) as exc:
        print(f"lint: {exc}", file=sys.stderr)
        return 2
    role_kinds = {spec.kind: spec for spec in ROLE_KINDS}
    results = []
    for kind, obj in objects:
        if kind not in role_kinds:
            continue
        role = role_kinds[kind].compile(compiler, obj)
        entries = len(role.permissions.entries) if role.permissions else 0
        results.append((kind, obj, role, entries, role_errors(compiler, role, obj)))
    warned = {id(obj): placement_warnings(role.placement) if role.placement else []
              for _, obj, role, _, _ in results}  # fmt: skip
    if not results:
        print("lint: no Role or ClusterRole found", file=sys.stderr)
        return 2
    if args.output == "json":
        roles = [
            {"kind": kind, "namespace": role.ref.namespace, "name": role.ref.name,
             "valid": not errors, "entries": entries, "errors": errors,
             **({"warnings": warned[id(obj)]} if warned[id(obj)] else {})}
            for kind, obj, role, entries, errors in results
        ]  # fmt: skip
        invalid = sum(not r["valid"] for r in roles)
        print(json.dumps({"valid": len(roles) - invalid, "invalid": invalid, "roles": roles},
                         indent=2))  # fmt: skip
    else:
        for kind, obj, _, entries, errors in results:
            name = _manifest_name(kind, obj)
            for error in errors:
                print(f"invalid: {name}: {error}")
            for warning in warned[id(obj)]:
                print(f"warning: {name}: {warning}")
            if not errors:
                print(f"ok: {name} ({entries} permission entr{'y' if entries == 1 else 'ies'})")
    return 1 if any(errors for *_, errors in results) else 0


def _manifest_name(kind: str, obj: Mapping[str, Any]) -> str:
    """``role t1/x``, ``role x`` (no namespace in the file yet), ``clusterrole x``, as written."""
    meta = obj.get("metadata")
    name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
    namespace = meta.get("namespace") if isinstance(meta, Mapping) and kind == "Role" else None
    return f"{kind.lower()} {f'{namespace}/' if namespace else ''}{name or '(no name)'}"
