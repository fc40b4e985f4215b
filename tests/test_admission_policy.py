"""The shipped compiled-policy manifests: generated from the code, wired to the parameter kind,
and covering what the compiler compiles and nothing the webhook keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.admission_policy import ACTIONS, COMPILER, GUARD, manifests, mode_manifests, render_yaml
from app.engine.params import API_VERSION, KIND, NAME, PLURAL, WEBHOOK_RESOURCES
from tests.support import ROOT

COMPILED = ROOT / "manifests" / "compiled"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPILED / name).read_text()) if d]


def every() -> list[dict[str, Any]]:
    return manifests() + mode_manifests()


def test_the_shipped_policies_are_the_generated_ones() -> None:
    assert (COMPILED / "policy.yaml").read_text() == render_yaml()
    assert (COMPILED / "modes" / "policy.yaml").read_text() == render_yaml(modes=True)
    assert documents("policy.yaml") == manifests()


@pytest.mark.parametrize("directory", [COMPILED, COMPILED / "modes"], ids=["compiled", "modes"])
def test_each_component_ships_every_file(directory: Path) -> None:
    (kustomization,) = yaml.safe_load_all((directory / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    files = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_the_crd_serves_the_kind_the_policies_read() -> None:
    (crd,) = documents("crd.yaml")
    group, version = API_VERSION.split("/")
    assert crd["spec"]["group"] == group
    assert crd["spec"]["names"]["kind"] == KIND
    assert crd["spec"]["names"]["plural"] == PLURAL
    assert crd["spec"]["scope"] == "Namespaced"
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == [version]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # One managed-fields entry for the index, however many subjects it holds.
    assert spec["properties"]["rules"]["x-kubernetes-map-type"] == "atomic"
    assert spec["properties"]["grants"]["x-kubernetes-map-type"] == "atomic"


def test_each_mode_has_its_policy_binding_and_action() -> None:
    by_kind: dict[str, dict[str, Any]] = {}
    for doc in every():
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    bindings = by_kind["ValidatingAdmissionPolicyBinding"]
    for name, (_, action) in ACTIONS.items():
        policy = by_kind["ValidatingAdmissionPolicy"][name]
        assert policy["spec"]["paramKind"] == {"apiVersion": API_VERSION, "kind": KIND}
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert bindings[name]["spec"]["validationActions"] == [action]
        assert bindings[name]["spec"]["paramRef"] == {
            "name": NAME,
            "parameterNotFoundAction": "Deny",
        }
    assert "paramRef" not in bindings[GUARD]["spec"]


def test_the_policies_leave_what_the_webhook_keeps_and_the_parameters_themselves() -> None:
    group = API_VERSION.split("/")[0]
    for name in ACTIONS:
        (policy,) = [
            d for d in every() if d["metadata"]["name"] == name and "paramKind" in d["spec"]
        ]
        excluded = {
            (g, r)
            for rule in policy["spec"]["matchConstraints"]["excludeResourceRules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
        }
        assert excluded == {*WEBHOOK_RESOURCES, (group, "*")}
        (matched,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert matched["scope"] == "Namespaced" and matched["resources"] == ["*"]


def test_only_the_compiler_passes_the_guard_of_the_parameters() -> None:
    (guard,) = [
        d for d in manifests() if d["metadata"]["name"] == GUARD and "validations" in d["spec"]
    ]
    (validation,) = guard["spec"]["validations"]
    assert validation["expression"] == f"request.userInfo.username == '{COMPILER}'"
