"""Every regular expression that validates input matches whole texts only.

Python's ``$`` also matches before a final newline, and jsonschema *searches* a ``pattern``, so a
validator written ``^...$`` accepts ``configmaps\\n``: a key that names no resource and so, in an
annotation, leaves ``configmaps`` unrestricted. These tests keep the class from coming back: no
string in the code ends in a bare ``$``, every schema pattern is built by ``whole()``, and every
validator refuses a valid text with whitespace added at either end.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.policy import (
    DEFAULT_ANNOTATION_KEY,
    SCHEMA,
    AnnotationError,
    is_label_key,
    is_label_value,
    parse_permissions,
    resource_pattern,
    whole,
)
from app.engine.rbac import RBAC_GROUP
from tests.support import ROOT, WHITESPACE, binding, make_review, role, rule, served


def padded(text: str) -> list[Any]:
    """``text`` with each kind of whitespace before and after it."""
    return [
        pytest.param(variant, id=f"{where}-{space.encode('unicode_escape').decode()}")
        for space in WHITESPACE
        for where, variant in (("after", text + space), ("before", space + text))
    ]


def _strings(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def test_no_string_in_the_code_ends_in_a_bare_dollar() -> None:
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in _strings(ast.parse(path.read_text(), str(path))):
            if re.search(r"(?<!\\)\$\Z", node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "use whole() or fullmatch, not $:\n" + "\n".join(found)


def _patterns(schema: Any) -> Iterator[str]:
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key == "pattern":
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _patterns(item)


def test_every_schema_pattern_is_anchored_at_both_ends() -> None:
    patterns = list(_patterns(SCHEMA))
    assert len(patterns) >= 4
    for pattern in patterns:
        assert pattern.startswith("^(?:") and pattern.endswith(r")\Z"), pattern


@pytest.mark.parametrize("body", ["a", "a|b", "b|a"])
def test_whole_refuses_a_final_newline_and_anchors_every_alternative(body: str) -> None:
    compiled = re.compile(whole(body))
    assert compiled.search("a")
    assert not compiled.search("a\n")
    assert not compiled.search("xa") and not compiled.search("ax")


def _refused(document: Mapping[str, Any]) -> str:
    with pytest.raises(AnnotationError) as caught:
        parse_permissions(json.dumps(document))
    return str(caught.value)


@pytest.mark.parametrize("key", padded("configmaps"))
def test_annotation_resource_pattern_must_be_whole(key: str) -> None:
    assert "is not a resource pattern" in _refused({key: {"team": ["a"]}})
    with pytest.raises(AnnotationError):
        resource_pattern(key)


@pytest.mark.parametrize("key", padded("example.com/team"))
def test_annotation_label_key_must_be_whole(key: str) -> None:
    assert "is not a label key" in _refused({"configmaps": {key: ["a"]}})
    assert not is_label_key(key)


@pytest.mark.parametrize("value", padded("staging-*"))
def test_annotation_value_glob_must_be_whole(value: str) -> None:
    assert "is not a label value glob" in _refused({"configmaps": {"team": [value]}})


@pytest.mark.parametrize("value", padded("a.b-c_d"))
def test_label_value_must_be_whole(value: str) -> None:
    assert is_label_value("a.b-c_d") and is_label_value("")
    assert not is_label_value(value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("configmaps", id="resource"),
        pytest.param("deployments.apps/scale", id="group-and-subresource"),
        pytest.param("*.apps", id="glob"),
    ],
)
def test_the_valid_texts_themselves_pass(text: str) -> None:
    parse_permissions(json.dumps({text: {"example.com/team": ["staging-*", ""]}}))


# The whole path: ``python -m app lint`` and /validate, with keys that used to pass.
PADDED_KEYS = [pytest.param("configmaps" + s, id=s.encode("unicode_escape").decode())
               for s in ("\n", " ", "\t", "\r")]  # fmt: skip


@pytest.mark.parametrize("key", PADDED_KEYS)
def test_lint_calls_a_padded_resource_key_invalid(tmp_path: Path, key: str) -> None:
    annotation = json.dumps({key: {"team": ["a"]}})
    manifest = tmp_path / "role.json"
    manifest.write_text(json.dumps({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "padded", "namespace": "t1",
                     "annotations": {DEFAULT_ANNOTATION_KEY: annotation}},
        "rules": [rule("get list create update", "configmaps")],
    }))  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "app", "lint", str(manifest)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("invalid: role t1/padded: invalid labelrbac.io/permissions")
    assert "is not a resource pattern" in result.stdout


@pytest.fixture
def validate(tmp_path: Path) -> Iterator[FlaskClient]:
    objects = [
        role("writer", "t1", [rule("*", "configmaps"), rule("create update", "roles", RBAC_GROUP)],
             {"configmaps": {"team": ["a"]}}),
        binding("writer", "writer", "User:mallory", namespace="t1"),
    ]  # fmt: skip
    with served(tmp_path, [obj for _, obj in objects]) as client:
        yield client


def _role_review(annotation: Mapping[str, Any]) -> dict[str, Any]:
    obj = {
        "metadata": {"name": "grant", "namespace": "t1",
                     "annotations": {DEFAULT_ANNOTATION_KEY: json.dumps(annotation)}},
        "rules": [rule("get list create update", "configmaps")],
    }  # fmt: skip
    return make_review("mallory", "CREATE", f"roles.{RBAC_GROUP}", namespace="t1", name="grant",
                       kind="Role", labels={}, extra_object=obj)  # fmt: skip


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param({"configmaps": {"team": []}}, id="no-values"),
        *[pytest.param({p.values[0]: {"team": ["a"]}}, id=f"resource-{p.id}") for p in PADDED_KEYS],
        *[pytest.param({"configmaps": {"team" + p.values[0][10:]: ["a"]}}, id=f"key-{p.id}")
          for p in PADDED_KEYS],
        *[pytest.param({"configmaps": {"team": ["a" + p.values[0][10:]]}}, id=f"value-{p.id}")
          for p in PADDED_KEYS],
    ],
)  # fmt: skip
def test_validate_refuses_a_role_with_a_padded_annotation_as_invalid(
    validate: FlaskClient, annotation: Mapping[str, Any]
) -> None:
    response = validate.post("/validate", json=_role_review(annotation))
    assert response.status_code == 200
    answer = response.get_json()["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422, answer["status"]
    assert "invalid labelrbac.io/permissions annotation" in answer["status"]["message"]


def test_validate_accepts_the_same_role_unpadded(validate: FlaskClient) -> None:
    response = validate.post("/validate", json=_role_review({"configmaps": {"team": ["a"]}}))
    assert response.get_json()["response"]["allowed"] is True
