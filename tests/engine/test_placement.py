"""The placement annotation: its schema, and the pure matching of pod specs and Nodes against it.

The property tests compare the matching with a reference of what the scheduler does: a pod the
placement counts as pinned can be placed on no node outside the pool, and the tolerations it lets
through tolerate no taint it does not permit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.placement import (
    DEFAULT_PLACEMENT_KEY,
    EFFECTS,
    Placement,
    PodPlacement,
    parse_placement,
    placement_errors,
    placement_of,
    placement_warnings,
)
from app.engine.policy import MAX_VALUES_PER_KEY, AnnotationError, Requirement

POOL = "node-restriction.kubernetes.io/pool"
EXAMPLE = {
    "nodeLabels": {POOL: ["a", "shared-*"]},
    "tolerations": [{"key": "pool", "values": ["a"], "effects": ["NoSchedule", "NoExecute"]}],
}


def test_example_parses() -> None:
    found = parse_placement(json.dumps(EXAMPLE))
    assert [(r.key, [g.text for g in r.values]) for r in found.node_labels] == [
        (POOL, ["a", "shared-*"])
    ]
    (toleration,) = found.tolerations
    assert toleration.key == "pool" and toleration.effects == {"NoSchedule", "NoExecute"}
    assert not toleration.exists


def test_effects_default_to_all_and_star_permits_exists() -> None:
    found = parse_placement('{"tolerations": [{"key": "gpu", "values": ["*"]}]}')
    assert found.tolerations[0].effects == frozenset(EFFECTS)
    assert found.tolerations[0].exists
    assert found.node_labels == ()


@pytest.mark.parametrize(
    ("document", "error"),
    [
        pytest.param({}, "should be non-empty", id="empty"),
        pytest.param([], "is not of type 'object'", id="not-object"),
        pytest.param({"nodeLabels": {}}, "nodeLabels", id="no-node-labels"),
        pytest.param({"nodeLabels": {POOL: []}}, "should be non-empty", id="no-values"),
        pytest.param({"nodeLabels": {"bad key!": ["a"]}}, "is not a label key", id="bad-key"),
        pytest.param({"nodeLabels": {POOL: ["a b"]}}, "is not a label value glob", id="bad-glob"),
        pytest.param({"nodeLabels": {POOL: ["*a" * 17]}}, "at most 16 wildcards", id="wildcards"),
        pytest.param(
            {"nodeLabels": {POOL: [f"v{i}" for i in range(MAX_VALUES_PER_KEY + 1)]}},
            "value globs, over the limit",
            id="values-per-key",
        ),
        pytest.param(
            {"nodeLabels": {f"k{i}": [f"v{j}" for j in range(60)] for i in range(5)}},
            "300 value globs in all, over the limit of 256 per role",
            id="values-per-role",
        ),
        pytest.param({"nodeLabel": {POOL: ["a"]}}, "Additional properties", id="typo"),
        pytest.param({"tolerations": []}, "should be non-empty", id="no-tolerations"),
        pytest.param({"tolerations": [{"values": ["a"]}]}, "'key' is a required", id="no-key"),
        pytest.param(
            {"tolerations": [{"key": "p*", "values": ["a"]}]}, "is not a label key", id="key-glob"
        ),
        pytest.param(
            {"tolerations": [{"key": "p", "values": ["a"], "effects": []}]},
            "should be non-empty",
            id="no-effects",
        ),
        pytest.param(
            {"tolerations": [{"key": "p", "values": ["a"], "effects": ["NoSchedule"] * 2}]},
            "non-unique",
            id="repeated-effect",
        ),
        pytest.param(
            {"tolerations": [{"key": "p", "values": ["a"]}] * 65},
            "65 toleration entries, over the limit of 64",
            id="too-many-tolerations",
        ),
    ],
)
def test_schema(document: Any, error: str) -> None:
    with pytest.raises(AnnotationError, match=r"schema violation|over the limit") as raised:
        parse_placement(json.dumps(document))
    assert error in str(raised.value)
    # lint lists every problem; each names the key.
    found = placement_errors(
        {DEFAULT_PLACEMENT_KEY: json.dumps(document)}, (DEFAULT_PLACEMENT_KEY,)
    )
    assert found and all(f.startswith(f"invalid {DEFAULT_PLACEMENT_KEY} annotation") for f in found)


def test_json_errors_and_renamed_keys() -> None:
    with pytest.raises(AnnotationError, match="not valid JSON"):
        parse_placement("{")
    with pytest.raises(AnnotationError, match="nested too deeply"):
        parse_placement("[" * 100_000)
    renamed = placement_of({"example.com/where": json.dumps(EXAMPLE)}, ("example.com/where",))
    assert renamed is not None and renamed.annotation_key == "example.com/where"
    assert placement_of({DEFAULT_PLACEMENT_KEY: "{"}, ("example.com/where",)) is None
    with pytest.raises(AnnotationError, match="more than one placement annotation"):
        placement_of({"a/p": "{}", "b/p": "{}"}, ("a/p", "b/p"))


def test_lint_warns_about_keys_a_kubelet_may_set() -> None:
    found = parse_placement(json.dumps({"nodeLabels": {POOL: ["a"], "pool": ["a"]}}))
    (warning,) = placement_warnings(found)
    assert "node label pool is outside node-restriction.kubernetes.io/" in warning


@pytest.mark.parametrize(
    ("narrow", "excess"),
    [
        pytest.param(EXAMPLE, None, id="same"),
        pytest.param(None, "without a placement", id="none"),
        pytest.param({"nodeLabels": {POOL: ["a"], "zone": ["z"]}}, None, id="more-keys"),
        pytest.param({"nodeLabels": {POOL: ["shared-1"]}}, None, id="covered-by-glob"),
        pytest.param(
            {"nodeLabels": {"zone": ["z"]}}, f"without pinning node label {POOL}", id="key"
        ),
        pytest.param({"nodeLabels": {POOL: ["a", "b"]}}, f'{POOL}="b"', id="value"),
        pytest.param({"nodeLabels": {POOL: ["*"]}}, f'{POOL}="*"', id="star"),
        pytest.param(
            {"nodeLabels": {POOL: ["a"]}, "tolerations": [{"key": "pool", "values": ["a"]}]},
            "tolerating pool in [a] (NoSchedule, PreferNoSchedule, NoExecute)",
            id="more-effects",
        ),
        pytest.param(
            {
                "nodeLabels": {POOL: ["a"]},
                "tolerations": [{"key": "pool", "values": ["*"], "effects": ["NoSchedule"]}],
            },
            "tolerating pool in [*]",
            id="exists",
        ),
    ],
)
def test_excess(narrow: Any, excess: str | None) -> None:
    wide = parse_placement(json.dumps(EXAMPLE))
    other = None if narrow is None else parse_placement(json.dumps(narrow))
    found = wide.excess(other)
    assert found == excess if excess is None else (found is not None and excess in found)


def test_malformed_specs_pin_nothing_and_never_raise() -> None:
    placement = parse_placement(json.dumps(EXAMPLE))
    for spec in (
        None,
        [],
        "x",
        {"nodeSelector": [POOL]},
        {"affinity": {"nodeAffinity": 3}},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [None, {"matchExpressions": "x"}]
                    }
                }
            }
        },
        {"tolerations": "all"},
        {"nodeSelector": {POOL: 1}},
    ):
        assert placement.unpinned(PodPlacement.of(spec)) is not None


def test_pinning_reads_each_value_once() -> None:
    """Linear time: a required affinity of many terms and values costs one glob test per value
    (never terms x values x keys): the values are indexed by key when the spec is read."""
    terms = [
        {
            "matchExpressions": [
                {"key": k, "operator": "In", "values": ["a"] * 50} for k in ("x", POOL)
            ]
        }
        for _ in range(200)
    ]
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    }
    pod = PodPlacement.of(spec)
    calls = 0
    base = parse_placement(json.dumps({"nodeLabels": {POOL: ["a"]}})).node_labels[0]

    class Counting(Requirement):
        def allows(self, value: str) -> bool:
            nonlocal calls
            calls += 1
            return super().allows(value)

    assert pod.pins(Counting(base.key, base.values))
    assert calls == 200 * 50


# --- properties against a reference scheduler ----------------------------------------------------

VALUES = st.sampled_from(["a", "b", "shared-1", "c"])
KEYS = st.sampled_from([POOL, "zone"])
OPERATORS = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt"])
EXPRESSIONS = st.builds(
    lambda key, op, values: {"key": key, "operator": op, "values": values},
    KEYS,
    OPERATORS,
    st.lists(VALUES, max_size=3),
)
TERMS = st.lists(
    st.builds(lambda e: {"matchExpressions": e}, st.lists(EXPRESSIONS, max_size=3)), max_size=3
)
SPECS = st.fixed_dictionaries(
    {},
    optional={
        "nodeSelector": st.dictionaries(KEYS, VALUES, max_size=2),
        "affinity": st.builds(
            lambda terms: {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                }
            },
            TERMS,
        ),
    },
)
NODES = st.lists(st.dictionaries(KEYS, VALUES, max_size=2), min_size=1, max_size=6)


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    value = labels.get(expr["key"])
    op = expr["operator"]
    if op == "In":
        return value in expr["values"]
    if op == "NotIn":
        return value not in expr["values"]
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    return value is not None  # Gt/Lt: some nodes may match; assume any labelled one does


def schedulable(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """The reference: whether the scheduler may place a pod with ``spec`` on a node."""
    if any(labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
        return False
    affinity = spec.get("affinity")
    if affinity is None:
        return True
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # Terms are ORed; an empty term matches no node.
    return any(
        term["matchExpressions"]
        and all(_expression_matches(e, labels) for e in term["matchExpressions"])
        for term in terms
    )


PLACEMENT = parse_placement(json.dumps({"nodeLabels": {POOL: ["a", "shared-*"]}}))


@given(SPECS, NODES)
def test_a_pinned_pod_can_run_only_in_the_pool(
    spec: dict[str, Any], nodes: list[dict[str, str]]
) -> None:
    if PLACEMENT.unpinned(PodPlacement.of(spec)) is None:
        for labels in nodes:
            if schedulable(spec, labels):
                assert PLACEMENT.node_misfit(labels) is None, (spec, labels)


@given(st.lists(VALUES, min_size=1, max_size=3))
def test_a_selector_or_every_term_in_pins(values: list[str]) -> None:
    """The converse, for the pinning forms the rule names: they are recognised."""
    within = all(v in ("a", "shared-1") for v in values)
    by_affinity = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": POOL, "operator": "In", "values": values}]}
                    ]
                    * 2
                }
            }
        }
    }
    assert (PLACEMENT.unpinned(PodPlacement.of(by_affinity)) is None) == within
    by_selector = {"nodeSelector": {POOL: values[0]}}
    assert (PLACEMENT.unpinned(PodPlacement.of(by_selector)) is None) == (
        values[0] in ("a", "shared-1")
    )


TOLERATION_PLACEMENT: Placement = parse_placement(
    json.dumps(
        {
            "tolerations": [
                {"key": "pool", "values": ["a"], "effects": ["NoSchedule"]},
                {"key": "gpu", "values": ["*"]},
            ]
        }
    )
)
TAINT_KEYS = st.sampled_from(["pool", "gpu", "other", "node.kubernetes.io/not-ready"])
TOLERATIONS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "key": TAINT_KEYS | st.just(""),
            "operator": st.sampled_from(["Equal", "Exists", "Lt"]),
            "value": VALUES,
            "effect": st.sampled_from(["", *EFFECTS]),
        },
    ),
    max_size=3,
)
TAINTS = st.tuples(TAINT_KEYS, VALUES, st.sampled_from(EFFECTS))


def tolerates(toleration: dict[str, Any], taint: tuple[str, str, str]) -> bool:
    """The reference: Kubernetes' ToleratesTaint."""
    key, value, effect = taint
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key", "") and toleration["key"] != key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and toleration.get("value", "") == value


def permitted(taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    if key.startswith("node.kubernetes.io/"):
        return True
    return (key, value, effect) == ("pool", "a", "NoSchedule") or key == "gpu"


@given(TOLERATIONS, st.lists(TAINTS, max_size=4))
def test_permitted_tolerations_tolerate_only_permitted_taints(
    tolerations: list[dict[str, Any]], taints: list[tuple[str, str, str]]
) -> None:
    pod = PodPlacement.of({"tolerations": tolerations})
    if TOLERATION_PLACEMENT.untolerated(pod) is None:
        for taint in taints:
            if any(tolerates(t, taint) for t in tolerations):
                assert permitted(taint), (tolerations, taint)


ODD = st.none() | st.integers() | st.lists(st.text(max_size=2), max_size=2) | st.text(max_size=3)
RAW_TOLERATIONS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "key": TAINT_KEYS | st.just("") | ODD,
            "operator": st.sampled_from(["Equal", "Exists", "Lt", ""]) | ODD,
            "value": VALUES | ODD,
            "effect": st.sampled_from(["", *EFFECTS]) | ODD,
        },
    )
    | ODD,
    max_size=3,
)
BOTH = parse_placement(
    json.dumps({"nodeLabels": {POOL: ["a", "shared-*"]},
                "tolerations": [{"key": "pool", "values": ["a"], "effects": ["NoSchedule"]},
                                {"key": "gpu", "values": ["*", "x?"]}]})
)  # fmt: skip


@given(SPECS, RAW_TOLERATIONS | ODD)
def test_the_one_pass_answer_is_the_explained_one(spec: dict[str, Any], tolerations: Any) -> None:
    """``admits`` (every admission of a placed pod) agrees with ``unpinned`` and
    ``untolerated`` (which explain a refusal), malformed fields included."""
    spec = {**spec, "tolerations": tolerations}
    pod = PodPlacement.of(spec)
    explained = BOTH.unpinned(pod) is None and BOTH.untolerated(pod) is None
    assert BOTH.admits(spec) == explained
