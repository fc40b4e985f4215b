"""The compiled label rule against the webhook, through a real kube-apiserver: same verdict, same
message.

A control plane runs the shipped CRD and policies (manifests/compiled) and no webhook. Its RBAC is
read back, compiled (``app.engine.params``) and written as the compiler's identity. Then every
write of a generated table (operations x subjects x label globs x resourceNames x modes) and every
recorded AdmissionReview the policy covers is sent to the API server as the user it names
(dry-run, so the state stays as set up), and the same AdmissionReview is decided by the webhook's
pipeline in-process (``/validate``'s ``evaluate``): the API server's verdict must equal it, and a
denial must carry its message. Writes RBAC refuses never reach admission and are not compared.
"""

from __future__ import annotations

import copy
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from app.compiled.admission_policy import ACTIONS, COMPILER, policy
from app.compiled.admission_policy import binding as policy_binding
from app.compiled.proof import MERGE
from app.engine.context import Context, Options
from app.engine.decide import evaluate
from app.engine.kinds import KINDS, snapshot_from_objects
from app.engine.model import AUDIT, WARN, Resource, labels_of
from app.engine.params import (
    CHUNK_CODE_POINTS,
    NAME,
    PLURAL,
    SOFTENED_MARK,
    Target,
    in_scope,
    namespace_marks,
    namespaces_of,
    render,
    render_cluster,
)
from app.engine.rbac import Snapshot
from app.settings import Settings
from app.webhook.wire import parse_review
from tests.kube.conftest import require_control_plane
from tests.kube.controlplane import (
    ADMIN,
    COMPILER_USER,
    ControlPlane,
    User,
    service_account,
)
from tests.support import FIXTURES as V124
from tests.support import GHOST_OWNER as GHOST
from tests.support import ROOT, binding, role, rule

COMPILED = ROOT / "manifests" / "compiled"
# Every recorded API server version (``$LABEL_RBAC_FIXTURES`` names one of them).
FIXTURES = V124.parent
NS = "t1"
FIELD_MANAGER = "label-rbac-compiler"

BUILDER = service_account("ci", "builder")
USERS = (
    User(ADMIN, ("system:masters",)),
    User("alice", ("tenants",)),  # team-a, and shared through tenants
    User("bob", ("tenants",)),  # team-b
    User("carol", ("auditors",)),  # team-a and an unrestricted editor
    User("dave"),  # team-c on the object "fixed" only (resourceNames)
    User("erin"),  # team-w in warn mode
    User("frank"),  # team-u in audit mode
    User("gina"),  # team-a and a role with a broken annotation
    User("hank"),  # the broken role only
    User("ivan", ("platform",)),  # a ClusterRole bound cluster-wide: team x? on every resource
    User("uma", ("platform",)),  # team-a here and team x? cluster-wide: labels from both
    User("pam"),  # cluster-wide: team p on the object "fixed" only (resourceNames)
    User("quinn"),  # cluster-wide: a ClusterRole with a broken annotation
    User("zed"),  # bound after the parameters were rendered
    User("nora"),  # writes configmaps without limits, deletes only team-a's
    User("olga"),  # team-a: writes any configmap, deletes only "fixed"; and team-b
    # Creates team-b's, and may create "fixed" as team p (cluster-wide: rita) or c (here: sam)
    # by a rule naming it, which grants no create without an update of that name too.
    User("rita"),
    User("sam"),
    BUILDER,  # team-b through a ServiceAccount subject
    COMPILER_USER,
)
SUBJECTS = [u for u in USERS if u.name not in (COMPILER, "zed", "nora")]


def _team(name: str, glob: list[str], verbs: str = "*", names: str = "", **kw: Any) -> Any:
    return role(
        name, NS, [rule(verbs, "configmaps", names=names)], {"configmaps": {"team": glob}}, **kw
    )


RBAC = [
    _team("team-a", ["a"]),
    _team("team-b", ["b"]),
    _team("team-c", ["c"], verbs="create update patch delete", names="fixed"),
    _team("team-w", ["w"], mode=WARN),
    _team("team-u", ["u"], mode=AUDIT),
    role(
        "shared",
        NS,
        [rule("create", "configmaps")],
        {"configmaps": {"team": ["shared-*"], "env": ["dev", "stag?"]}},
    ),
    role("editor", NS, [rule("*", "configmaps secrets")]),
    role("broken", NS, [rule("create update", "configmaps")], "{not json"),
    role(
        "platform-x",
        "",
        [rule("create update patch delete", "configmaps secrets")],
        {"*": {"team": ["x?"]}},
    ),
    binding("alice-a", "team-a", "User:alice", namespace=NS),
    binding("bob-b", "team-b", "User:bob", "ServiceAccount:ci:builder", namespace=NS),
    binding("tenants-shared", "shared", "Group:tenants", namespace=NS),
    binding("carol-a", "team-a", "User:carol", namespace=NS),
    binding("carol-editor", "editor", "User:carol", namespace=NS),
    binding("dave-c", "team-c", "User:dave", namespace=NS),
    binding("erin-w", "team-w", "User:erin", namespace=NS),
    binding("frank-u", "team-u", "User:frank", namespace=NS),
    binding("gina-a", "team-a", "User:gina", namespace=NS),
    binding("uma-a", "team-a", "User:uma", namespace=NS),
    binding("gina-broken", "broken", "User:gina", namespace=NS),
    binding("hank-broken", "broken", "User:hank", namespace=NS),
    binding("platform", "platform-x", "Group:platform"),
    role(
        "named-p",
        "",
        [rule("create update patch delete", "configmaps", names="fixed")],
        {"configmaps": {"team": ["p"]}},
    ),
    binding("pam", "named-p", "User:pam"),
    role("cluster-broken", "", [rule("create update", "configmaps")], "{not json"),
    binding("quinn", "cluster-broken", "User:quinn"),
    role("writer", NS, [rule("create update patch", "configmaps")]),
    _team("deleter-a", ["a"], verbs="delete"),
    binding("nora-writer", "writer", "User:nora", namespace=NS),
    binding("nora-deleter", "deleter-a", "User:nora", namespace=NS),
    # Its operations point to different grants (the delete names its object): a map of
    # operations in every layout, where the policy must read each operation's own grant (with
    # team-b beside it, RBAC lets olga delete any configmap: its labels decide).
    role(
        "mixed-a",
        NS,
        [rule("create update patch", "configmaps"), rule("delete", "configmaps", names="fixed")],
        {"configmaps": {"team": ["a"]}},
    ),
    binding("olga-mixed", "mixed-a", "User:olga", namespace=NS),
    binding("olga-b", "team-b", "User:olga", namespace=NS),
    _team("creator-b", ["b"], verbs="create"),
    binding("creators-b", "creator-b", "User:rita", "User:sam", namespace=NS),
    role(
        "creates-fixed-p",
        "",
        [rule("create", "configmaps", names="fixed")],
        {"configmaps": {"team": ["p"]}},
    ),
    binding("rita", "creates-fixed-p", "User:rita"),
    _team("creates-fixed-c", ["c"], verbs="create", names="fixed"),
    binding("sam-c", "creates-fixed-c", "User:sam", namespace=NS),
]
COMPILER_RBAC = [
    role("compiler", "", [rule("get list create update patch", "labelrbacparams", "labelrbac.io")]),
    binding("compiler", "compiler", f"User:{COMPILER}"),
]


def rbac(item: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", **item[1]}


# --- the API server -------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    warnings: tuple[str, ...]

    @property
    def message(self) -> str:
        return self.body.get("message", "") if isinstance(self.body, dict) else str(self.body)

    @property
    def reached_admission(self) -> bool:
        """False when RBAC refused the request (admission never saw it)."""
        return not (self.status == 403 and "cannot " in self.message and "User " in self.message)


def call(
    cp: ControlPlane, user: str, method: str, path: str, body: Any = None, content: str = ""
) -> Answer:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        cp.url + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {cp.users[user].token}",
            "Content-Type": content or "application/json",
        },
    )
    context = ssl.create_default_context(cafile=str(cp.ca))
    try:
        with urllib.request.urlopen(req, context=context, timeout=20) as resp:
            raw, status, headers = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as err:
        raw, status, headers = err.read(), err.code, err.headers
    try:
        decoded = json.loads(raw)
    except ValueError:
        decoded = raw.decode(errors="replace")
    return Answer(status, decoded, tuple(headers.get_all("Warning") or ()))


def admin(cp: ControlPlane, method: str, path: str, body: Any = None) -> Any:
    answer = call(cp, ADMIN, method, path, body)
    assert answer.status < 300, (method, path, answer.status, answer.message)
    return answer.body


RBAC_PATHS = {
    "Role": "/apis/rbac.authorization.k8s.io/v1/roles",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/rolebindings",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Namespace": "/api/v1/namespaces",
}


def cluster_snapshot(cp: ControlPlane) -> Snapshot:
    """The API server's RBAC and namespaces, as the webhook's source compiles them."""
    objects = [
        (spec.kind, item)
        for spec in KINDS
        if spec.kind in RBAC_PATHS
        for item in admin(cp, "GET", RBAC_PATHS[spec.kind])["items"]
    ]
    return snapshot_from_objects(objects, Settings().compiler)


def write_params(
    cp: ControlPlane,
    snapshot: Snapshot,
    options: Options,
    chunk: int = CHUNK_CODE_POINTS,
    earlier: bool = False,
) -> None:
    """Render every namespace and the cluster part (in constants of ``chunk`` code points),
    and apply them server-side as the compiler does: the policies holding the cluster part,
    and the parameters (``earlier``: in the layout an earlier release wrote), each namespace
    labeled softened before them as the compiler labels a compiled one (the namespaces here are
    not marked compiled)."""
    target = Target.of([Resource("", "configmaps"), Resource("", "secrets")], options)
    target = replace(target, earlier=earlier)
    part = render_cluster(snapshot, replace(target, chunk_code_points=chunk))
    cp.apply(ADMIN, [policy(name, part) for name in ACTIONS])
    for namespace in sorted(namespaces_of(snapshot)):
        rendered = render(snapshot, namespace, target)
        softened = namespace_marks(True, rendered.softened)[SOFTENED_MARK]
        label = {"metadata": {"labels": {SOFTENED_MARK: softened}}}
        answer = call(cp, ADMIN, "PATCH", f"/api/v1/namespaces/{namespace}", label, MERGE)
        assert answer.status < 300, answer.message
        path = (
            f"/apis/labelrbac.io/v1alpha1/namespaces/{namespace}/{PLURAL}/{NAME}"
            f"?fieldManager={FIELD_MANAGER}&force=true"
        )
        answer = call(
            cp, COMPILER, "PATCH", path, rendered.manifest(), "application/apply-patch+yaml"
        )
        assert answer.status < 300, answer.message


def wait_for(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_control_plane()
    cp = ControlPlane(tmp_path_factory.mktemp("vap"), users=USERS)
    cp.start()
    try:
        cp.apply(ADMIN, (COMPILED / "crd.yaml").read_text())
        wait_for(
            lambda: call(cp, ADMIN, "GET", f"/apis/labelrbac.io/v1alpha1/{PLURAL}").status == 200,
            "the CRD",
        )
        cp.apply(ADMIN, (COMPILED / "policy.yaml").read_text())
        cp.apply(ADMIN, (COMPILED / "modes" / "policy.yaml").read_text())
        for namespace in (NS, "ci", "label-rbac"):
            admin(cp, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        cp.apply(ADMIN, [rbac(item) for item in (*COMPILER_RBAC, *RBAC)])
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def compiled(cluster: ControlPlane) -> Snapshot:
    """The parameters in place and enforced (a known denial is seen)."""
    snapshot = cluster_snapshot(cluster)
    write_params(cluster, snapshot, Options())
    probe = configmap("probe", {"team": "b"})
    wait_for(
        lambda: (
            "may not create" in call(cluster, "alice", "POST", collection(dry=True), probe).message
        ),
        "the policies to enforce the parameters",
    )
    # The warn policy is bound apart, and may reach the API server's policy cache later.
    wait_for(
        lambda: any(
            "(not enforced: warn mode)" in warning
            for warning in warnings_of(call(cluster, "erin", "POST", collection(dry=True), probe))
        ),
        "the warn policy to warn",
    )
    return snapshot


# --- requests ---------------------------------------------------------------------------------


def collection(namespace: str = NS, resource: str = "configmaps", dry: bool = False) -> str:
    return f"/api/v1/namespaces/{namespace}/{resource}" + ("?dryRun=All" if dry else "")


def configmap(name: str, labels: Mapping[str, str], namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "data": {"k": "v"},
    }


def review(
    user: User, operation: str, name: str, new: Any, old: Any, namespace: str = NS
) -> dict[str, Any]:
    """The AdmissionReview the API server sends a webhook for this write."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-4000-8000-000000000000",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "requestResource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": user.name, "groups": [*user.groups, "system:authenticated"]},
            "object": new,
            "oldObject": old,
            "dryRun": True,
        },
    }


def warnings_of(answer: Answer) -> list[str]:
    """The text of each ``Warning: 299 - "..."`` header."""
    found = []
    for header in answer.warnings:
        text = header.partition(" - ")[2]
        found.append(text[1:-1].replace('\\"', '"').replace("\\\\", "\\"))
    return found


def compare(
    answer: Answer, document: Mapping[str, Any], snapshot: Snapshot, options: Options
) -> str | None:
    """'' when the API server's verdict equals the webhook's, else what differs; None when RBAC
    refused the write (neither front door sees it)."""
    if not answer.reached_admission:
        return None
    decision = evaluate(parse_review(document).request, Context(snapshot, options))
    allowed = answer.status < 300
    if allowed != decision.allowed:
        return f"API server {answer.status} {answer.message!r}; webhook {decision}"
    if not allowed and not answer.message.endswith(f"denied request: {decision.message}"):
        return f"messages differ: {answer.message!r} vs {decision.message!r}"
    # The policy's warning ends with the webhook's own (``decide.apply_mode``), word for word.
    warned = any(w.endswith(f": {text}") for w in warnings_of(answer) for text in decision.warnings)
    if decision.mode == WARN and decision.softened and not warned:
        return f"warning missing: {answer.warnings} vs {decision.warnings!r}"
    return ""


LABELS: list[dict[str, str]] = [
    {"team": "a"},
    {"team": "b"},
    {},
    {"team": "shared-x", "env": "stag1"},
    {"team": "shared-x"},
    {"team": "c"},
    {"team": "w"},
    {"team": "u"},
    {"team": "x1"},
    {"team": "p"},
]
OLD_STATES: list[dict[str, str]] = [{"team": "a"}, {"team": "b"}, {}, {"team": "c"}, {"team": "w"}]
NAMES = ("plain", "fixed")


def run_table(cluster: ControlPlane, snapshot: Snapshot, options: Options) -> list[str]:
    """Every subject x operation x labels x name; the disagreements."""
    failures: list[str] = []
    compared = 0

    def check(user: User, op: str, name: str, new: Any, old: Any, answer: Answer) -> None:
        nonlocal compared
        found = compare(answer, review(user, op, name, new, old), snapshot, options)
        compared += found is not None
        if found:
            failures.append(
                f"{user.name} {op} {name} {labels_of(new)} (stored {labels_of(old)}): {found}"
            )

    for name in NAMES:
        call(cluster, ADMIN, "DELETE", f"{collection()}/{name}")
    for user in SUBJECTS:
        for name in NAMES:
            for labels in LABELS:
                new = configmap(name, labels)
                # A server-side apply creating the object is authorized on its name.
                apply = f"{collection()}/{name}?dryRun=All&fieldManager=differential"
                check(
                    user,
                    "CREATE",
                    name,
                    new,
                    None,
                    call(cluster, user.name, "PATCH", apply, new, "application/apply-patch+yaml"),
                )
                check(
                    user,
                    "CREATE",
                    name,
                    new,
                    None,
                    call(cluster, user.name, "POST", collection(dry=True), new),
                )
    for stored in OLD_STATES:
        olds = {}
        for name in NAMES:
            call(cluster, ADMIN, "DELETE", f"{collection()}/{name}")
            olds[name] = admin(cluster, "POST", collection(), configmap(name, stored))
        for user in SUBJECTS:
            for name, old in olds.items():
                item = f"{collection()}/{name}?dryRun=All"
                for labels in LABELS:
                    new = copy.deepcopy(old)
                    new["metadata"]["labels"] = labels
                    check(
                        user, "UPDATE", name, new, old, call(cluster, user.name, "PUT", item, new)
                    )
                check(user, "DELETE", name, None, old, call(cluster, user.name, "DELETE", item))
    # Most writes reach admission: the table is not vacuous.
    assert compared > len(SUBJECTS) * len(LABELS) * 8, compared
    return failures


def test_the_api_server_decides_every_generated_write_as_the_webhook(
    cluster: ControlPlane, compiled: Snapshot
) -> None:
    failures = run_table(cluster, compiled, Options())
    assert not failures, "\n".join(failures)


def test_a_cluster_part_in_several_constants_decides_as_one(
    cluster: ControlPlane, compiled: Snapshot
) -> None:
    """The ClusterRoleBindings' part split a subject per constant (the policy's constants are
    bounded in size): the same verdicts and messages, in the same order."""
    target = Target.of([Resource("", "configmaps"), Resource("", "secrets")])
    one = render_cluster(compiled, target)
    several = render_cluster(compiled, replace(target, chunk_code_points=600))
    assert len(one.chunks) == 1 < len(several.chunks), (len(one.chunks), len(several.chunks))
    write_params(cluster, compiled, Options(), chunk=600)
    time.sleep(2)  # the policy cache of the API server follows its informer
    try:
        failures = run_table(cluster, compiled, Options())
    finally:
        write_params(cluster, compiled, Options())
    assert not failures, "\n".join(failures)


def test_parameters_an_earlier_release_wrote_are_decided_as_the_webhook(
    cluster: ControlPlane, compiled: Snapshot
) -> None:
    """After an upgrade the policy reads parameters of the earlier layout until the compiler
    has written every namespace again (``LAYOUT``): every entry a map of operations, every
    requirement with its four lists. The same verdicts and messages as this release's layout,
    which holds both kinds of entry here (a role granting every operation alike, and one
    granting some)."""
    target = Target.of([Resource("", "configmaps"), Resource("", "secrets")])
    entries = {
        type(e)
        for n in namespaces_of(compiled)
        for r in render(compiled, n, target).spec.get("roles", {}).values()
        for e in r.values()
    }
    assert entries == {str, dict}
    write_params(cluster, compiled, Options(), earlier=True)
    time.sleep(2)  # the policy's informer of the parameters follows them
    try:
        failures = run_table(cluster, compiled, Options())
    finally:
        write_params(cluster, compiled, Options())
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("mode", [WARN, AUDIT])
def test_the_global_mode_softens_the_api_servers_denials_as_the_webhooks(
    cluster: ControlPlane, compiled: Snapshot, mode: str
) -> None:
    options = Options(mode=mode)
    write_params(cluster, compiled, options)
    try:
        wait_for(
            lambda: (
                call(
                    cluster, "alice", "POST", collection(dry=True), configmap("p", {"team": "b"})
                ).status
                == 201
            ),
            "the softened parameters",
        )
        failures = run_table(cluster, compiled, options)
    finally:
        write_params(cluster, compiled, Options())
        wait_for(
            lambda: (
                call(
                    cluster, "alice", "POST", collection(dry=True), configmap("p", {"team": "b"})
                ).status
                == 403
            ),
            "the enforcing parameters",
        )
    assert not failures, "\n".join(failures)


def test_a_subject_bound_after_the_parameters_were_rendered_is_refused_until_they_are(
    cluster: ControlPlane, compiled: Snapshot
) -> None:
    zed = next(u for u in USERS if u.name == "zed")
    cluster.apply(ADMIN, [rbac(binding("zed-a", "team-a", "User:zed", namespace=NS))])
    good = configmap("z", {"team": "a"})
    wait_for(
        lambda: call(cluster, "zed", "POST", collection(dry=True), good).reached_admission,
        "RBAC to see the binding",
    )
    stale = call(cluster, "zed", "POST", collection(dry=True), good)
    assert stale.status == 403
    assert stale.message.endswith(
        'denied request: user "zed" may not create configmaps "z" in namespace "t1": the compiled '
        'label permissions of namespace "t1" do not list this user yet; retry in a moment'
    )
    fresh = cluster_snapshot(cluster)
    write_params(cluster, fresh, Options())
    wait_for(
        lambda: call(cluster, "zed", "POST", collection(dry=True), good).status == 201,
        "the new parameters",
    )
    bad = configmap("z", {"team": "b"})
    assert (
        compare(
            call(cluster, "zed", "POST", collection(dry=True), bad),
            review(zed, "CREATE", "z", bad, None),
            fresh,
            Options(),
        )
        == ""
    )


def test_only_the_compiler_may_write_parameters(cluster: ControlPlane, compiled: Snapshot) -> None:
    path = f"/apis/labelrbac.io/v1alpha1/namespaces/{NS}/{PLURAL}/{NAME}"
    answer = call(cluster, ADMIN, "DELETE", path)
    assert answer.status == 403
    assert "only the compiler" in answer.message


def test_where_a_namespace_has_no_parameters_the_policy_stands_aside(
    cluster: ControlPlane, compiled: Snapshot
) -> None:
    """Not compiled yet, so not marked: the webhook's label entry judges its writes (none runs
    here), and only the compiler may mark it (tests/kube/test_namespace_deletion.py)."""
    admin(cluster, "POST", "/api/v1/namespaces", {"metadata": {"name": "fresh"}})
    answer = call(
        cluster, ADMIN, "POST", collection("fresh", dry=True), configmap("c", {}, "fresh")
    )
    assert answer.status == 201, answer.message


# --- writes that stand for a delete ------------------------------------------------------------

MINE = {**GHOST, "name": "mine", "uid": "11111111-0000-4000-8000-000000000001", "controller": True}
# (name, stored metadata, written metadata): what each write does to the stored object.
OWNER_WRITES = [
    ("owner-added", {}, {"ownerReferences": [GHOST]}),
    ("owner-changed", {"ownerReferences": [MINE]}, {"ownerReferences": [GHOST]}),
    ("orphaned", {"ownerReferences": [MINE]}, {}),
    ("owners-kept", {"ownerReferences": [MINE]}, {"ownerReferences": [MINE], "annotations": {}}),
    ("finalizer-added", {}, {"finalizers": ["example.com/hold"]}),
    ("both", {}, {"ownerReferences": [GHOST], "finalizers": ["example.com/hold"]}),
]


def _without_entries(message: str) -> str:
    """The webhook's message without the entries it names (``metadata.x (adds ...)``), which
    the policy's leaves out: each parenthesis after a field name, matched."""
    for field in ("metadata.ownerReferences (", "metadata.finalizers ("):
        start = message.find(field)
        if start < 0 or message[start + len(field) :].startswith("or "):
            continue
        depth, end = 0, start + len(field) - 1
        for end in range(start + len(field) - 1, len(message)):
            depth += {"(": 1, ")": -1}.get(message[end], 0)
            if depth == 0:
                break
        message = message[: start + len(field) - 2] + message[end + 1 :]
    return message


def test_a_write_standing_for_a_delete_is_decided_by_the_api_server_as_by_the_webhook(
    cluster: ControlPlane, compiled: Snapshot
) -> None:
    """Owner references and finalizers set or changed (``app.engine.owners``): in a compiled
    namespace the policy alone judges a ConfigMap, so it judges the delete too, with the
    webhook's verdict and words (less the entries the webhook names)."""
    failures: list[str] = []
    refused = 0
    users = [u for u in USERS if u.name not in (COMPILER, "zed", ADMIN)]
    for case, before, after in OWNER_WRITES:
        for team in ("a", "b", "w"):
            name = f"{case}-{team}"
            call(cluster, ADMIN, "DELETE", f"{collection()}/{name}")
            stored = configmap(name, {"team": team})
            stored["metadata"] |= before
            stored = admin(cluster, "POST", collection(), stored)
            written: list[tuple[str, Any, Any, str, str]] = []
            new = copy.deepcopy(stored)
            new["metadata"] = {
                k: v for k, v in new["metadata"].items() if k not in ("ownerReferences",)
            } | after
            written.append(("UPDATE", new, stored, "PUT", f"{collection()}/{name}?dryRun=All"))
            created = configmap(f"new-{name}", {"team": team})
            created["metadata"] |= after
            written.append(("CREATE", created, None, "POST", collection(dry=True)))
            for user in users:
                for operation, obj, old, method, path in written:
                    answer = call(cluster, user.name, method, path, obj)
                    if not answer.reached_admission:
                        continue
                    document = review(user, operation, obj["metadata"]["name"], obj, old)
                    request = parse_review(document).request
                    decision = evaluate(request, Context(compiled, Options()))
                    where = f"{user.name} {operation} {case} team={team}"
                    if (answer.status < 300) != decision.allowed:
                        failures.append(f"{where}: {answer.status} {answer.message!r}; {decision}")
                    elif not decision.allowed:
                        refused += 1
                        expected = _without_entries(decision.message)
                        if not answer.message.endswith(f"denied request: {expected}"):
                            failures.append(f"{where}: {answer.message!r} vs {expected!r}")
    assert not failures, "\n".join(failures)
    assert refused > 10, refused  # the table is not vacuous: some writes stand for a refused delete


@pytest.mark.parametrize(("team", "refused"), [("a", False), ("b", True)])
def test_the_policy_compares_owner_references_in_order(
    cluster: ControlPlane, compiled: Snapshot, team: str, refused: bool
) -> None:
    """A reordering is a change to the policy (not to the webhook, which compares multisets):
    refused only to whom the delete is, nora on team b's object."""
    name = f"reordered-{team}"
    call(cluster, ADMIN, "DELETE", f"{collection()}/{name}")
    stored = configmap(name, {"team": team})
    stored["metadata"]["ownerReferences"] = [MINE, GHOST]
    stored = admin(cluster, "POST", collection(), stored)
    new = copy.deepcopy(stored)
    new["metadata"]["ownerReferences"] = [GHOST, MINE]
    answer = call(cluster, "nora", "PUT", f"{collection()}/{name}?dryRun=All", new)
    assert (answer.status == 403) is refused, answer.message
    if refused:
        assert "it changes metadata.ownerReferences, and the garbage collector" in answer.message
    nora = next(u for u in USERS if u.name == "nora")
    document = review(nora, "UPDATE", name, new, stored)
    assert evaluate(parse_review(document).request, Context(compiled, Options())).allowed


# --- recorded reviews -------------------------------------------------------------------------


def recorded() -> list[Any]:
    """The recorded AdmissionReviews of writes the policy judges (not a kubelet's)."""
    found = []
    for path in sorted(FIXTURES.glob("*/admission-reviews/*.json")):
        request = json.loads(path.read_text())["request"]
        res = Resource(
            request["resource"].get("group", ""),
            request["resource"]["resource"],
            request.get("subResource", ""),
        )
        if (
            request["operation"] in ("CREATE", "UPDATE", "DELETE")
            and request.get("namespace")
            and in_scope(res)
            and "system:nodes" not in request["userInfo"].get("groups", [])
            and res.resource == "configmaps"
        ):
            found.append(pytest.param(path, id=f"{path.parent.parent.name}/{path.stem}"))
    return found


def _stored(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """A recorded object as a client would send it: no server-set fields."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    return {
        **{k: v for k, v in obj.items() if k != "metadata"},
        "metadata": {**kept, "namespace": namespace},
    }


@pytest.mark.parametrize("path", recorded())
def test_a_recorded_write_is_decided_by_the_api_server_as_by_the_webhook(
    cluster: ControlPlane, compiled: Snapshot, path: Path
) -> None:
    document = json.loads(path.read_text())
    request = document["request"]
    recorded_user = request["userInfo"]["username"]
    user = next((u for u in USERS if u.name == recorded_user), None)
    if user is None:
        pytest.skip(f"{recorded_user} has no token here")
    # A collection delete reaches admission once per object, without a name.
    collection_delete = request["operation"] == "DELETE" and not request.get("name")
    old = request.get("oldObject")
    name = request.get("name") or (old or request["object"])["metadata"]["name"]
    # Replayed in the namespace compiled here, as the user, against the recorded stored object.
    call(cluster, ADMIN, "DELETE", f"{collection()}/{name}")
    stored = admin(cluster, "POST", collection(), _stored(old, NS)) if old else None
    new = _stored(request["object"], NS) if request.get("object") else None
    item = f"{collection()}/{name}?dryRun=All"
    if request["operation"] == "CREATE":
        answer = call(cluster, user.name, "POST", collection(dry=True), new)
    elif request["operation"] == "UPDATE":
        assert new is not None and stored is not None
        new["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        answer = call(cluster, user.name, "PUT", item, new)
    elif collection_delete:
        selector = f"{collection(dry=True)}&fieldSelector=metadata.name%3D{name}"
        answer = call(cluster, user.name, "DELETE", selector)
    else:
        answer = call(cluster, user.name, "DELETE", item)
    replay = review(user, request["operation"], "" if collection_delete else name, new, stored)
    assert compare(answer, replay, compiled, Options()) == ""


PROBED = "labelrbac.io/conditions-probe"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@pytest.fixture(scope="module")
def conditions(cluster: ControlPlane, compiled: Snapshot) -> Iterator[str]:
    """A copy of the enforcing policy's match conditions, as ``write_params`` writes them, over
    a validation that always fails, bound in Warn on the objects labeled ``PROBED`` only: a
    write the match conditions select answers with the copy's warning, one they leave out
    without it."""
    enforcing = next(n for n, (mode, _) in ACTIONS.items() if mode == "enforce")
    target = Target.of([Resource("", "configmaps"), Resource("", "secrets")], Options())
    copy_of = policy(enforcing, render_cluster(compiled, target))
    name = "conditions-copy"
    copy_of["metadata"]["name"] = name
    copy_of["spec"]["validations"] = [{"expression": "false", "message": "matched"}]
    bound = policy_binding(enforcing)
    bound["metadata"]["name"] = bound["spec"]["policyName"] = name
    bound["spec"]["validationActions"] = ["Warn"]
    bound["spec"]["matchResources"]["objectSelector"] = {"matchLabels": {PROBED: "true"}}
    cluster.apply(ADMIN, [copy_of, bound])
    refused = configmap("conditions-probe", {"team": "w", PROBED: "true"})
    wait_for(
        lambda: (
            "matched"
            in " ".join(warnings_of(call(cluster, "ivan", "POST", collection(dry=True), refused)))
        ),
        "the copy of the match conditions",
    )
    try:
        yield "matched"
    finally:
        admin(cluster, "DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{name}")
        admin(cluster, "DELETE", f"{ADMISSION}/validatingadmissionpolicies/{name}")


@pytest.mark.parametrize(
    ("user", "labels", "status", "matched"),
    [
        pytest.param("ivan", {"team": "x1"}, 201, False, id="cluster-grant-permits"),
        pytest.param("uma", {"team": "x2"}, 201, False, id="cluster-grant-of-a-group"),
        pytest.param("alice", {"team": "a"}, 201, False, id="namespace-grant-permits"),
        pytest.param("ivan", {"team": "w"}, 403, True, id="cluster-grant-refuses"),
        pytest.param("quinn", {"team": "a"}, 403, True, id="cluster-grant-broken"),
        pytest.param("bob", {"team": "x1"}, 403, True, id="another-users-cluster-grant"),
    ],
)
def test_a_write_a_cluster_grant_permits_by_itself_ends_at_the_match_conditions(
    cluster: ControlPlane,
    conditions: str,
    user: str,
    labels: dict[str, str],
    status: int,
    matched: bool,
) -> None:
    """A write a grant of the ClusterRoleBindings permits by itself costs the API server one
    pass, as one the namespace's roles permit: the enforcing policy's match conditions hold the
    cluster part again and leave the write out, where before the validation and its message
    each looked the grants up again. One that grant refuses, a broken grant, or another user's
    grant, the conditions select, and the validation judges."""
    written = configmap("conditions-probe", {**labels, PROBED: "true"})
    answer = call(cluster, user, "POST", collection(dry=True), written)
    assert answer.status == status, answer.message
    assert (conditions in " ".join(warnings_of(answer))) is matched
