"""matchConditions evaluated as the API server evaluates them: CEL (cel-python) on the request."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import celpy

# A SubjectAccessReview's typed string fields: absent on the wire, "" to CEL.
RESOURCE_FIELDS = ("namespace", "verb", "group", "version", "resource", "subresource", "name")


def conditions_pass(conditions: Iterable[Mapping[str, Any]], request: Mapping[str, Any]) -> bool:
    """Whether every ``matchConditions`` expression is true for ``request``."""
    env = celpy.Environment()
    activation = {"request": celpy.json_to_cel(dict(request))}
    return all(
        bool(env.program(env.compile(c["expression"])).evaluate(activation)) for c in conditions
    )


def reaches_authorizer(webhook: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether an authorization webhook entry's matchConditions let a review ``spec`` through."""
    typed = copy.deepcopy(dict(spec))
    typed.setdefault("groups", [])
    typed.setdefault("user", "")
    if "resourceAttributes" in typed:
        for field in RESOURCE_FIELDS:
            typed["resourceAttributes"].setdefault(field, "")
    return conditions_pass(webhook["webhook"]["matchConditions"], typed)
