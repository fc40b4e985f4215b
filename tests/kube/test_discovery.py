"""What the compiled policy does not positively know is judged, never let through: through a real
kube-apiserver with ``manifests/enforce-compiled`` installed and the compiler running.

Tenants' kinds of group ``example.com``: widgets (served at v1), gadgets (served only at
v1alpha1, not the group's preferred version) and things (its CRD created after the compiler's
discovery). An aggregated APIService ``v1beta9.example.com`` points at no Service and ranks first,
so the group's preferred version answers 503 to discovery. A role in ``t1`` restricts all three
and configmaps to ``team=a``; ``t2`` binds no restricted role, and holds an unbound copy of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.engine.context import UNJUDGED_ANNOTATION
from app.engine.params import NAME, PLURAL
from tests.kube.cluster import Compilers, LabelRbacCluster
from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, COMPILER_USER, DEFAULT_USERS
from tests.kube.test_coverage import crd
from tests.kube.test_split import decisions, marked
from tests.process import stop
from tests.support import binding, role, rule

GROUP = "example.com"
WIDGETS, GADGETS, THINGS = (f"{p}.{GROUP}" for p in ("widgets", "gadgets", "things"))
VERSIONS = {"widgets": "v1", "gadgets": "v1alpha1", "things": "v1", "bolts": "v1"}
KINDS = {
    "widgets": "Widget",
    "gadgets": "Gadget",
    "things": "Thing",
    "bolts": "Bolt",
    "configmaps": "ConfigMap",
}
WRITES = "create update patch delete"
TEAM_A = {"team": ["a"]}


def tenant(namespace: str) -> dict[str, Any]:
    restricted = {key: TEAM_A for key in ("configmaps", WIDGETS, GADGETS, THINGS)}
    rules = [rule(WRITES, "configmaps"), rule(WRITES, "widgets gadgets things", GROUP)]
    return rbac(role("tenant", namespace, rules, restricted))


def rbac(item: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", **item[1]}


# Ranked above the CRDs' own versions: discovery's preferred version of example.com.
BROKEN = {
    "apiVersion": "apiregistration.k8s.io/v1",
    "kind": "APIService",
    "metadata": {"name": f"v1beta9.{GROUP}"},
    "spec": {
        "group": GROUP,
        "version": "v1beta9",
        "groupPriorityMinimum": 1000,
        "versionPriority": 999,
        "insecureSkipTLSVerify": True,
        "service": {"namespace": "label-rbac", "name": "nowhere", "port": 443},
    },
}


def served(kube: LabelRbacCluster, plural: str) -> bool:
    path = f"/apis/{GROUP}/{VERSIONS[plural]}/{plural}"
    return kube.control_plane.request(ADMIN, "GET", path)[0] == 200


def unjudged(kube: LabelRbacCluster) -> list[str]:
    """What the registration leaves out (no annotation restricts it)."""
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/label-rbac"
    _, config = kube.control_plane.request(ADMIN, "GET", path)
    return list(json.loads(config["metadata"]["annotations"].get(UNJUDGED_ANNOTATION, "[]")))


def indexed(kube: LabelRbacCluster, namespace: str) -> list[str]:
    path = f"/apis/labelrbac.io/v1alpha1/namespaces/{namespace}/{PLURAL}/{NAME}"
    status, params = kube.control_plane.request(ADMIN, "GET", path)
    return list(params["spec"].get("indexed", [])) if status == 200 else []


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LabelRbacCluster, Compilers]]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("discovery")
    with LabelRbacCluster(
        workdir, users=(*DEFAULT_USERS, COMPILER_USER), overlay="enforce-compiled"
    ) as kube:
        cp = kube.control_plane
        for namespace in ("t1", "t2"):
            cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        cp.apply(ADMIN, [crd("widgets", "Widget"), crd("gadgets", "Gadget", ("v1alpha1",))])
        cp.apply(ADMIN, [BROKEN])
        for plural in ("widgets", "gadgets"):
            wait_for(lambda p=plural: served(kube, p), f"{plural} served")  # type: ignore[misc]
        cp.apply(ADMIN, [tenant("t1"), tenant("t2")])
        cp.apply(ADMIN, [rbac(binding("alice", "tenant", "User:alice", namespace="t1"))])
        compilers = Compilers(cp, workdir)
        compilers.start("first", "--lease-seconds", "2")
        try:
            wait_for(
                lambda: marked("t2", kube) and {WIDGETS, GADGETS} <= set(indexed(kube, "t2")),
                "compiled, and widgets and gadgets indexed",
                60,
            )
            yield kube, compilers
        finally:
            compilers.stop_all()


def write(kube: LabelRbacCluster, user: str, namespace: str, plural: str, team: str) -> str:
    """A dry-run create by ``user``: "" when allowed, else the API server's message."""
    version = "v1" if plural == "configmaps" else f"{GROUP}/{VERSIONS[plural]}"
    prefix = "/api/v1" if plural == "configmaps" else f"/apis/{version}"
    body = {
        "apiVersion": version,
        "kind": KINDS[plural],
        "metadata": {"name": f"o-{time.monotonic_ns()}", "labels": {"team": team}},
    }
    path = f"{prefix}/namespaces/{namespace}/{plural}?dryRun=All"
    status, answer = kube.control_plane.request(user, "POST", path, body)
    return "" if status < 300 else str(answer.get("message", answer))


UNKNOWN = f"do not know {THINGS} yet"
UNLISTED = 'the compiled label permissions of namespace "t2" do not list this user yet'


def test_the_preferred_version_failing_and_a_version_not_preferred_are_indexed_everywhere(
    cluster: tuple[LabelRbacCluster, Compilers],
) -> None:
    kube, compilers = cluster
    cp = kube.control_plane
    _, groups = cp.request(ADMIN, "GET", "/apis")
    (example,) = [g for g in groups["groups"] if g["name"] == GROUP]
    assert example["preferredVersion"]["version"] == "v1beta9"  # ... which answers 503
    assert cp.request(ADMIN, "GET", f"/apis/{GROUP}/v1beta9")[0] == 503
    assert f"discovery of /apis/{GROUP}/v1beta9 failed" in compilers.log("first")
    # Every namespace indexes what any annotation restricts, t2 too (no restricted role bound).
    for namespace in ("t1", "t2"):
        assert {"configmaps", WIDGETS, GADGETS} <= set(indexed(kube, namespace)), namespace


@pytest.fixture()
def webhook_down(cluster: tuple[LabelRbacCluster, Compilers]) -> Iterator[LabelRbacCluster]:
    kube, _ = cluster
    assert kube.webhook is not None
    stop(kube.webhook.process)
    try:
        yield kube
    finally:
        kube.restart_webhook()


LABEL_DENIAL = 'label team="b" is not permitted (role t1/tenant allows team in [a])'


@pytest.mark.parametrize(
    ("plural", "team", "expected"),
    [
        pytest.param("widgets", "a", "", id="preferred-version-503-own-bucket"),
        pytest.param("widgets", "b", LABEL_DENIAL, id="preferred-version-503-other-bucket"),
        pytest.param("gadgets", "a", "", id="not-preferred-version-own-bucket"),
        pytest.param("gadgets", "b", LABEL_DENIAL, id="not-preferred-version-other-bucket"),
    ],
)
def test_with_the_webhook_down_the_policy_judges_them(
    webhook_down: LabelRbacCluster, plural: str, team: str, expected: str
) -> None:
    message = write(webhook_down, "alice", "t1", plural, team)
    assert (expected in message and message != "") if expected else message == ""


def test_a_crd_created_after_the_restricting_role_is_refused_until_compiled(
    cluster: tuple[LabelRbacCluster, Compilers], capsys: pytest.CaptureFixture[str]
) -> None:
    """Served before the compiler has listed it, a resource is neither indexed nor known to need
    no judging: in a compiled namespace the policy refuses its writes (retry), never lets them
    through; once compiled, the policy judges them by their labels, alone."""
    kube, _ = cluster
    created = time.monotonic()
    kube.apply(ADMIN, [crd("things", "Thing")])
    wait_for(lambda: served(kube, "things"), "things served")
    refused = write(kube, "alice", "t1", "things", "b")
    assert LABEL_DENIAL in refused or UNKNOWN in refused, refused
    allowed = write(kube, "alice", "t1", "things", "a")
    assert allowed == "" or UNKNOWN in allowed, allowed
    # The compiler watches CRDs: discovery lists things at once, every namespace indexes them.
    wait_for(lambda: THINGS in indexed(kube, "t1"), "things compiled", 20, 0.02)
    with capsys.disabled():
        print(f"\n[discovery] CRD created -> compiled: {time.monotonic() - created:.2f} s")
    assert THINGS in indexed(kube, "t2")
    seen = decisions(kube, THINGS)
    assert LABEL_DENIAL in write(kube, "alice", "t1", "things", "b")
    assert write(kube, "alice", "t1", "things", "a") == ""
    assert decisions(kube, THINGS) == seen  # the policy's, not the webhook's


def test_a_new_crd_is_discovered_at_once(
    cluster: tuple[LabelRbacCluster, Compilers], capsys: pytest.CaptureFixture[str]
) -> None:
    """The compiler watches CRDs: a new one (no annotation restricts it) is listed by the next
    discovery at once, not a minute later; timed until the registration leaves it out."""
    kube, _ = cluster
    took = []
    for plural in ("sprockets", "cogs", "levers"):
        started = time.monotonic()
        kube.apply(ADMIN, [crd(plural, plural.title()[:-1])])
        key = f"{plural}.{GROUP}"
        wait_for(lambda k=key: k in unjudged(kube), f"{plural} left out", 20, 0.02)  # type: ignore[misc]
        took.append(time.monotonic() - started)
    with capsys.disabled():
        print(
            "\n[discovery] CRD created -> discovered and left out: "
            + ", ".join(f"{t:.2f} s" for t in took)
        )
    assert max(took) < 10  # a minute without the watch


def params_versions(kube: LabelRbacCluster) -> dict[str, str]:
    """Each namespace's parameters' resourceVersion."""
    _, listed = kube.control_plane.request(ADMIN, "GET", f"/apis/labelrbac.io/v1alpha1/{PLURAL}")
    return {o["metadata"]["namespace"]: o["metadata"]["resourceVersion"] for o in listed["items"]}


def test_a_crd_no_annotation_restricts_is_let_pass_by_the_policy_alone(
    cluster: tuple[LabelRbacCluster, Compilers], capsys: pytest.CaptureFixture[str]
) -> None:
    """The served resources no annotation restricts are the cluster's, stored once in the
    policy: a CRD created is one write of the policy, after which a compiled namespace lets
    its writes pass, and no namespace's parameters are written again for it."""
    kube, _ = cluster
    writer = role("bolts", "t2", [rule("create", "bolts", GROUP)])
    bound = binding("erin-bolts", "bolts", "User:erin", namespace="t2")
    kube.apply(ADMIN, [rbac(writer), rbac(bound)])
    time.sleep(3)  # the binding grants nothing indexed: nothing to write, waited out anyway
    before = params_versions(kube)
    created = time.monotonic()
    kube.apply(ADMIN, [crd("bolts", "Bolt")])
    wait_for(lambda: served(kube, "bolts"), "bolts served")
    first = write(kube, "erin", "t2", "bolts", "any")
    assert first == "" or "do not know bolts.example.com yet" in first, first
    wait_for(lambda: write(kube, "erin", "t2", "bolts", "any") == "", "bolts let pass", 20, 0.05)
    with capsys.disabled():
        print(f"\n[discovery] CRD created -> let pass: {time.monotonic() - created:.2f} s")
    assert marked("t2", kube)
    time.sleep(2)  # any write of the parameters the discovery caused would be done
    assert params_versions(kube) == before


def test_a_subject_bound_with_the_compiler_stopped_can_write_nothing_unchecked(
    cluster: tuple[LabelRbacCluster, Compilers],
) -> None:
    """bob is bound in t2, where no restricted role was bound when its parameters were written,
    while the compiler is down: every write the role restricts is refused as not listed yet, for
    as long as the compiler stays down; once it runs again, bob is judged by his labels."""
    kube, compilers = cluster
    compilers.kill("first")
    kube.apply(ADMIN, [rbac(binding("bob", "tenant", "User:bob", namespace="t2"))])
    seen = decisions(kube, "configmaps")
    for _ in range(3):
        for plural in ("configmaps", "widgets", "gadgets"):
            for team in ("a", "b"):
                assert UNLISTED in write(kube, "bob", "t2", plural, team), (plural, team)
        time.sleep(1)
    assert decisions(kube, "configmaps") == seen  # the policy's refusals
    compilers.start("second", "--lease-seconds", "2")
    wait_for(lambda: write(kube, "bob", "t2", "configmaps", "a") == "", "bob compiled", 60)
    assert 'label team="b" is not permitted (role t2/tenant' in write(
        kube, "bob", "t2", "gadgets", "b"
    )
