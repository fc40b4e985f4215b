"""``label-rbac compile``: keep every namespace's ``LabelRbacParams`` in step with RBAC.

The compiler watches RBAC through the webhook's own cluster source (``ClusterSource``: the same
informers and incremental snapshot) and renders parameters with ``app.engine.params``. Each batch
of changes the source applies marks the namespaces it touches (``params.touched``); the writer
renders only those and writes each with server-side apply under its own field manager, skipping
an object whose content did not change. The status goes in the same apply: one request per
namespace (the API server spends as much on a status write as on the parameters). Writes are a
pipeline of ``WRITERS`` at a time: a namespace touched while others are written is taken as soon
as a writer is free, never after a whole batch, and the lease is renewed with writes in flight
(the pipeline is never drained for it). A namespace too large to compile is written
``delegated`` and an Event says so. A compiled namespace is labeled ``labelrbac.io/compiled``
(``params.MARK``) once its parameters are written, and the label is taken off before they are
written delegated: with the label, the webhook leaves the namespace's plain writes to the policy.
One whose parameters soften a denial is labeled ``labelrbac.io/softened`` too
(``params.SOFTENED_MARK``), which the warn and audit policies' bindings select.

Exactly one replica writes: the one holding the ``coordination.k8s.io`` Lease (``LeaderLease``,
acquired and renewed as client-go's leader election does, expiry judged on the local clock from
when the record was last seen to change, so clock skew between replicas does not matter). A
replica writes only while its lease is current; one that gains the lease renders every namespace
again, so nothing its predecessor had not written yet is lost, and writes only those whose stored
parameters differ (namespaces a change touches first).

The leader also keeps the webhook registration's ``skip-unjudged`` conditions in step with the
roles and the served resources (``app.compiled.registration.CoverageWriter``), in a thread of its
own: its reads of the registration never hold up a namespace's parameters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Set
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from app.compiled.admission_policy import (
    ACTIONS,
    POLICY,
    PROBE_LABEL,
    PROBE_MESSAGE,
    SHIPPED,
    Install,
    policy,
    unjudged_of,
)
from app.compiled.health import CompilerHealth
from app.compiled.proof import (
    BATCH,
    FIELD_MANAGER,
    MERGE,
    NOT_SEEN,
    EpochUnchecked,
    Unseen,
    prove,
    retried,
)
from app.compiled.registration import CoverageWriter
from app.engine.context import Options
from app.engine.coverage import named
from app.engine.incremental import CATEGORIES, NAMESPACES, Change, LiveSnapshot
from app.engine.kinds import KindSpec
from app.engine.model import Resource
from app.engine.params import (
    ALL,
    API_VERSION,
    CLUSTER,
    KIND,
    LAYOUT,
    LAYOUT_ANNOTATION,
    MARK,
    MAX_BYTES,
    MAX_WORK,
    NAME,
    PLURAL,
    SOFTENED_MARK,
    ClusterPart,
    Namespaces,
    Rendered,
    Target,
    namespace_marks,
    render,
    render_cluster,
    resource_key,
    settling,
    spec_text,
    touched,
)
from app.engine.rbac import Restrictions, Snapshot
from app.settings import Settings
from app.source.api import ApiError, KubeClient, KubeError
from app.source.cluster import ClusterSource
from app.source.informer import Informer, Tuning
from app.source.lease import LeaderLease
from app.source.lease import micro_time as _now
from app.source.metadata import MetadataInformer

log = logging.getLogger("label_rbac.compile")

APPLY = "application/apply-patch+yaml"
_APPLY_QUERY = [("fieldManager", FIELD_MANAGER), ("force", "true")]
# The Namespace mark is merge-patched (``MERGE``): unlike an apply, a merge patch never creates
# the object (a namespace known only from its RoleBindings, or deleted meanwhile, stays absent).
# ``NOT_SEEN``: the API server's refusal of an update of parameters its informer does not hold
# yet, tried again with ``retried`` (``app.compiled.proof``).
# How often the served resources are listed again (a new aggregated API becomes compilable); a
# CRD changing (created, established, deleted, a version served or not) starts one at once.
DISCOVERY_INTERVAL = 60.0
# Namespaces written at once. Each is two or three requests in a row, and the API server answers
# many at a time: one by one, a batch of changes touching a hundred namespaces waited for two
# hundred round trips, each behind the one before.
WRITERS = 8
# How often steady writing is logged.
REPORT_EVERY = 10.0
# The status condition saying whether the namespace is compiled or left to the webhook.
CONDITION = "Compiled"
# How long a resource stays indexed after the last annotation restricting it went.
KEEP_INDEXED = 600.0
# Page size and (connect, read) timeouts of the lists a new leader reads. The stored parameters
# are read whole (a digest of each is kept), so a page of them is what the leader holds at once:
# their pages are sized to about PARAMS_PAGE_BYTES of specs by the sizes of the page before (10 at
# first), as parsed JSON takes several times its text (a page of 50 parameters at the size guard
# took 439 MB, one of 500 of 84 KB each 303 MB).
LIST_PAGE = 500
PARAMS_PAGE_BYTES = 4_000_000
PARAMS_PAGE_FIRST = 10
LIST_TIMEOUT = (10.0, 60.0)
# A namespace whose write failed is tried again after a delay doubling from BACKOFF_INITIAL up to
# BACKOFF_MAX seconds, jittered (between half and all of it): an API server refusing or
# unreachable is never hammered, and failures of many namespaces spread out.
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
# At most one warning of a kind of failure per this many seconds; the others are counted in it.
LOG_EVERY = 10.0


def backoff(failures: int, initial: float = BACKOFF_INITIAL, most: float = BACKOFF_MAX) -> float:
    """The delay before retry number ``failures`` (1 for the first): exponential, capped,
    jittered."""
    ceiling = min(most, initial * 2 ** max(0, failures - 1))
    return random.uniform(ceiling / 2, ceiling)


class Throttled:
    """One kind of warning, logged at most once every ``every`` seconds: those in between are
    counted and the count goes in the next line (a failure repeated by every namespace, or every
    retry, never floods the log)."""

    def __init__(
        self, every: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._every = every
        self._clock = clock
        self._last = -every
        self._held = 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: Any) -> None:
        with self._lock:
            now = self._clock()
            if now - self._last < self._every:
                self._held += 1
                return
            held, self._held, self._last = self._held, 0, now
        if held:
            message += f" ({held} more like it in the last {self._every:.0f}s)"
        log.warning(message, *args)


class ServedResources:
    """Discovery: the namespaced resources the API server serves and lets be created, at every
    version of every group (a CRD or a beta built-in may be served only at a version that is not
    its group's preferred one).

    A group version whose listing fails (an aggregated API answering 503, a 429, a timeout)
    keeps what it listed last: one failed request must not drop its resources until the next
    discovery. What was never listed is not known, and the compiled policy leaves it to the
    webhook (``app.compiled.registration``)."""

    def __init__(self) -> None:
        self._listed: dict[str, tuple[Resource, ...]] = {}

    def __call__(self, client: KubeClient) -> list[Resource]:
        versions = [("", "/api/v1")]
        for group in client.get("/apis").get("groups") or ():
            if not isinstance(group, Mapping):
                continue
            for version in group.get("versions") or ():
                found = version.get("groupVersion") if isinstance(version, Mapping) else None
                if isinstance(found, str) and found:
                    versions.append((str(group.get("name", "")), f"/apis/{found}"))
        listed: dict[str, tuple[Resource, ...]] = {}
        for group_name, path in versions:
            try:
                listed[path] = self._list(client, group_name, path)
            except KubeError as exc:
                kept = self._listed.get(path)
                log.warning(
                    "discovery of %s failed: %s; %s", path, exc,
                    f"keeping the {len(kept)} resources it listed before" if kept is not None
                    else "its resources are left to the webhook until it answers",
                )  # fmt: skip
                if kept is not None:
                    listed[path] = kept
        self._listed = listed
        return list(dict.fromkeys(res for found in listed.values() for res in found))

    @staticmethod
    def _list(client: KubeClient, group_name: str, path: str) -> tuple[Resource, ...]:
        found = []
        for res in client.get(path).get("resources") or ():
            if not isinstance(res, Mapping):
                continue
            name = res.get("name", "")
            if res.get("namespaced") and "/" not in name and "create" in (res.get("verbs") or ()):
                found.append(Resource(group_name, name))
        return tuple(found)


def _crd(_: object, obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a CRD discovery depends on: its name, scope, served versions and whether it is
    established (the API server serves it only then)."""
    spec = obj.get("spec") or {}
    versions = tuple(
        str(v.get("name")) for v in spec.get("versions") or () if isinstance(v, Mapping)
        and v.get("served")
    )  # fmt: skip
    conditions = (obj.get("status") or {}).get("conditions") or ()
    established = any(
        isinstance(c, Mapping) and c.get("type") == "Established" and c.get("status") == "True"
        for c in conditions
    )
    return (_name(obj), spec.get("group"), spec.get("scope"), versions, established)


CRDS = KindSpec(
    "CustomResourceDefinition", "apiextensions.k8s.io", "customresourcedefinitions", _crd
)


def served_resources(client: KubeClient) -> list[Resource]:
    """Namespaced resources the API server serves and lets be created (one discovery)."""
    return ServedResources()(client)


def digest(text: str) -> bytes:
    """What is kept of a spec's text to tell whether it changed: a namespace's parameters can
    take a hundred kilobytes, and a leader keeps one of these for every namespace."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass
class Written:
    """What was last written for a namespace (to skip writes that change nothing)."""

    spec: bytes  # ``digest`` of the spec's text
    delegated: bool
    marked: bool
    since: str = ""  # when the Compiled condition last changed (its lastTransitionTime)
    # Whether the policies are known to see these parameters (``app.compiled.proof``): a
    # namespace is marked only then.
    seen: bool = True
    # Whether the Namespace carries ``SOFTENED_MARK`` (``Rendered.softened``), as last written.
    softened: bool = False


@dataclass
class InFlight:
    """A write of one namespace's parameters under way. ``deleted`` once the parameters were
    deleted meanwhile (``ParamsWriter.gone``): what it wrote is gone with them, so it is never
    remembered as written. Kept only while the write runs, so deletions cost no memory after."""

    namespace: str
    deleted: bool = False
    # The writer's ``_generation`` when it was taken: a write taken before the index last grew
    # does not index what grew.
    generation: int = 0


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _marks(obj: Mapping[str, Any]) -> tuple[str, bool]:
    """(name, whether it is labeled ``SOFTENED_MARK``) of a Namespace."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return _name(obj), labels.get(SOFTENED_MARK) == "true"


Stored = tuple[str, Written | None]


class _PageSizer:
    """Page sizes of a list whose items vary in size: about ``budget`` bytes a page, by the
    sizes seen so far (``saw``), between ``first`` and ``most`` items."""

    def __init__(self, first: int, budget: int, most: int) -> None:
        self._first, self._budget, self._most = first, budget, most
        self._items, self._bytes = 0, 0

    def saw(self, size: int) -> None:
        self._items, self._bytes = self._items + 1, self._bytes + size

    def next(self) -> int:
        if not self._items:
            return self._first
        mean = max(1, self._bytes // self._items)
        return max(1, min(self._most, self._budget // mean))


def _stored_params(
    obj: Mapping[str, Any],
    saw: Callable[[int], None] | None = None,
    listing: set[str] | None = None,
) -> Stored:
    """(namespace, what it holds) of a stored ``LabelRbacParams``, its mark not known yet;
    ("", None) for another object than the compiler's. ``saw`` is told the spec's size;
    ``listing`` gets the resources it lists unjudged itself (an earlier release's)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if meta.get("name") != NAME or not isinstance(spec, dict):
        return "", None
    conditions = (obj.get("status") or {}).get("conditions") or ()
    since = next((str(c.get("lastTransitionTime") or "") for c in conditions
                  if isinstance(c, dict) and c.get("type") == CONDITION), "")  # fmt: skip
    text = spec_text(spec)
    if saw is not None:
        saw(len(text))
    if listing is not None and "delegated" not in spec:
        listing.update(k for k in spec.get("unjudged") or () if isinstance(k, str))
    written = Written(digest(text), "delegated" in spec, False, since)
    return str(meta.get("namespace") or ""), written


POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
# The API server compiles and checks a policy's every expression before storing it: with a cluster
# part of 100,000 code points that took it seconds on a loaded test machine, more than the
# default 10 s of a write.
POLICY_TIMEOUT = 60.0
# Seconds from a policy's write until the API server surely judges by it: its policy plugin looks
# for changed policies every second (``policyRefreshInterval``), then compiles them (a second or
# two at 200 cluster-wide grants, docs/performance.md).
POLICY_LOADED = 10.0


class PolicyWriter:
    """Keeps the policies that judge with the parameters holding the cluster part
    (``ClusterPart``: the ClusterRoleBindings' subjects, roles and grants, stored once).

    The compiler creates them (a server-side apply by name: its RBAC names them, and grants no
    create) and owns them whole: a ClusterRole or ClusterRoleBinding change is one write here
    rather than one per namespace. ``ready`` says every policy holds what this leader last
    applied; until then no namespace is newly marked compiled, since a marked namespace's plain
    writes are judged by the policy alone. A policy changed or deleted by anyone else (the watch
    of them says so: ``seen``) is applied again at the next step.
    """

    def __init__(
        self,
        client: KubeClient,
        names: Iterable[str],
        clock: Callable[[], float] = time.monotonic,
        install: Install = SHIPPED,
    ) -> None:
        self._client = client
        self._install = install
        # Each policy's name in this install (the chart's ``name``) → its shipped one.
        self._shipped = {install.renamed(name): name for name in names}
        self.names = tuple(self._shipped)
        self._clock = clock
        # One probe at a time, backed off when it fails (``claim_probe``).
        self._probing = False
        self._probe_failures = 0
        self._next_probe = 0.0
        self._lock = threading.Lock()
        # name → (digest of what was applied, the resourceVersion it got)
        self._applied: dict[str, tuple[bytes, str]] = {}
        self._kept: ClusterPart | None = None  # the part last applied
        # The resources the policies applied last, and before them, let pass unjudged (None:
        # not known, any of them), and when they changed (``listed``).
        self._listed: frozenset[str] | None = None
        self._before: frozenset[str] | None = None
        self._listed_at = 0.0
        # Until when an earlier release's policy may be in force (``earlier_in_force``): None,
        # or infinity until this writer has written its own.
        self._earlier_until: float | None = None
        self.on_change: Callable[[], None] = _nothing
        # Whether the API server was seen enforcing the policy since it was last created
        # (``ParamsWriter._probe``): a policy just created is not in force until it is loaded.
        self.proven = False

    @property
    def ready(self) -> bool:
        with self._lock:
            return all(name in self._applied for name in self.names)

    def claim_probe(self) -> bool:
        """Whether this writer may probe now (``ParamsWriter._probe``): one at a time, and after
        a failed one not before its backoff, so a policy the API server never enforces (its
        binding deleted) costs a probe now and then, not one per namespace."""
        with self._lock:
            if self.proven or self._probing or self._clock() < self._next_probe:
                return False
            self._probing = True
            return True

    def probed(self, enforced: bool) -> None:
        with self._lock:
            self._probing = False
            if enforced:
                self.proven, self._probe_failures = True, 0
            else:
                self._probe_failures += 1
                self._next_probe = self._clock() + backoff(self._probe_failures)

    def reset(self) -> None:
        """Forget what was applied (a new leader writes every policy once)."""
        with self._lock:
            self._applied.clear()
            self._listed = self._before = self._earlier_until = None
        self.proven = False

    def adopt(self, earlier: frozenset[str] | None) -> None:
        """What the enforcing policy in force lets pass unjudged, read when this writer starts
        leading (``listed``): a previous leader wrote it. A release before 0.3.4's holds no such
        constant and reads each namespace's parameters instead: then what those list,
        ``earlier`` (None: not known, any served resource). A policy not marked with this
        release's ``LAYOUT`` stays ``earlier_in_force`` until this writer's are, and so does
        one that cannot be read: every release's policy reads the earlier layout. None known
        when the policy cannot be read; none at all where there is no policy yet."""
        found: frozenset[str] | None = None
        earlier_in_force = True
        others = [n for n in self.names if n != self._install.name]  # the warn and audit ones
        try:
            live = self._client.get(f"{POLICIES}/{self._install.name}")
            annotations = (live.get("metadata") or {}).get("annotations") or {}
            found = unjudged_of(live)
            if found is None:  # no constant: the earlier lists
                found = earlier
            earlier_in_force = annotations.get(LAYOUT_ANNOTATION) != LAYOUT or any(
                map(self._earlier, others)
            )
        except ApiError as exc:
            if exc.status == 404:
                found = frozenset()
                earlier_in_force = any(map(self._earlier, others))
        except (KubeError, ValueError, TypeError):
            found = None
        with self._lock:
            self._listed, self._before, self._listed_at = found, None, float("-inf")
            self._earlier_until = float("inf") if earlier_in_force else None

    def _earlier(self, name: str) -> bool:
        """Whether the policy ``name`` may be an earlier release's: not marked with this
        release's ``LAYOUT``, or not readable (none: not)."""
        try:
            live = self._client.get(f"{POLICIES}/{name}", metadata_only=True)
        except ApiError as exc:
            return exc.status != 404
        except KubeError:
            return True
        annotations = (live.get("metadata") or {}).get("annotations") or {}
        return annotations.get(LAYOUT_ANNOTATION) != LAYOUT

    def in_force(self) -> frozenset[str] | None:
        """What the policy applied last lets pass unjudged (on taking the lease: the one in
        force, ``adopt``); None when not known."""
        with self._lock:
            return self._listed

    def earlier_in_force(self) -> bool:
        """Whether an earlier release's policy may still be in force, which reads each
        namespace's parameters in an earlier layout (``Target.earlier``): found on taking the
        lease, until ``POLICY_LOADED`` seconds after this writer first wrote its own."""
        with self._lock:
            until = self._earlier_until
            if until is not None and self._clock() > until:
                until = self._earlier_until = None
            return until is not None

    def listed(self, served: Iterable[str]) -> frozenset[str]:
        """The resources the policies in force may let pass unjudged: those the part last
        applied lists, and for ``POLICY_LOADED`` seconds after it changed, those the one before
        listed (the API server loads a written policy on its next refresh tick, then compiles
        it); ``served`` (every resource key) where what the policy in force lets pass is not
        known (it could not be read on taking the lease)."""
        with self._lock:
            listed, before, at = self._listed, self._before, self._listed_at
        if listed is None:
            return frozenset(served)
        if self._clock() - at > POLICY_LOADED:
            return listed
        return listed | (frozenset(served) if before is None else before)

    def keep(self, part: ClusterPart) -> int:
        """Apply every policy whose content differs from what was last applied (or that
        someone else changed since); how many were written."""
        with self._lock:
            if part is self._kept and len(self._applied) == len(self.names):
                return 0  # every step asks: the policies' text is built only when it may differ
        written = 0
        for name, shipped in self._shipped.items():
            body = self._install.document(policy(shipped, part))
            found = digest(json.dumps(body, sort_keys=True))
            with self._lock:
                last = self._applied.get(name)
            if last is not None and last[0] == found:
                continue
            answer = self._client.send(
                "PATCH", f"{POLICIES}/{name}", body, _APPLY_QUERY, APPLY, POLICY_TIMEOUT
            )
            meta = answer.get("metadata") or {}
            if meta.get("generation") in (None, 1) and name == self._install.name:
                self.proven = False  # created just now
            with self._lock:
                self._applied[name] = (found, str(meta.get("resourceVersion") or ""))
            written += 1
        with self._lock:
            self._kept = part
            first_over_earlier = self._earlier_until == float("inf")
            if self._listed != frozenset(part.unjudged) or first_over_earlier:
                self._before, self._listed = self._listed, frozenset(part.unjudged)
                self._listed_at = self._clock()
            if first_over_earlier:
                self._earlier_until = self._listed_at + POLICY_LOADED
        if written:
            log.info("wrote the policies %s (%d constants, %d code points, %d grants)",
                     ", ".join(self.names), len(part.chunks), part.size, part.grants)  # fmt: skip
        return written

    def seen(self, old: object, new: object) -> None:
        """The watch of one policy: ``new`` its (name, resourceVersion), None once deleted; a
        version other than the one applied is someone else's change."""
        name = old[0] if isinstance(old, tuple) else new[0] if isinstance(new, tuple) else None
        with self._lock:
            last = self._applied.get(str(name))
            if last is None or (isinstance(new, tuple) and new[1] == last[1]):
                return
            del self._applied[str(name)]
        if new is None and name == self._install.name:
            self.proven = False
        log.warning("policy %s was changed or deleted by someone else: writing it again", name)
        self.on_change()


def _policy_version(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")


def policy_informers(client: KubeClient, policies: PolicyWriter, tuning: Tuning) -> list[Informer]:
    """A metadata-only watch of each policy the compiler writes, by name (its RBAC names
    them), telling ``policies`` of every change (``PolicyWriter.seen``)."""
    spec = KindSpec(
        "ValidatingAdmissionPolicy",
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        lambda _c, o: _policy_version(o),
    )
    return [
        MetadataInformer(spec, client, _policy_version, _nothing, tuning,
                         on_update=policies.seen, field_selector=f"metadata.name={name}")
        for name in policies.names
    ]  # fmt: skip


class Unmarked(KubeError):
    """A namespace's parameters were written, but it could not be marked compiled yet (the
    enforcing policy is not in force there yet): ``written`` is what was written, and the mark
    is tried again after a backoff."""

    def __init__(self, written: Written, why: str) -> None:
        super().__init__(why)
        self.written = written


class PendingNamespaces:
    """The namespaces to render again: those a change touched, oldest first, then (after ``ALL``)
    every other one, so a change is never queued behind the whole cluster's render."""

    def __init__(self) -> None:
        self._everything = True
        self._touched: dict[str, None] = {}
        self._rest: dict[str, None] = {}

    def add(self, names: Iterable[str]) -> None:
        if set(names) >= ALL:
            self._everything = True
        else:
            self._touched.update(dict.fromkeys(names))

    def empty(self) -> bool:
        """Whether nothing is pending."""
        return not (self._everything or self._touched or self._rest)

    def at_least(self, n: int) -> bool:
        """Whether ``n`` namespaces or more are pending (every one counts as many)."""
        return self._everything or len(self._touched) + len(self._rest) >= n

    def take(self, known: Set[str], busy: Set[str], most: int, rest: bool = True) -> list[str]:
        """Up to ``most`` of the pending namespaces in ``known`` and not in ``busy`` (those stay
        pending), only those a change touched unless ``rest``; namespaces no longer known are
        dropped."""
        if self._everything:
            self._everything = False
            self._rest = dict.fromkeys(sorted(known))
        taken: list[str] = []
        for queue in (self._touched, self._rest) if rest else (self._touched,):
            dropped: list[str] = []
            for name in queue:  # from the oldest, only as far as needed
                if len(taken) >= most:
                    break
                if name not in known:
                    dropped.append(name)
                elif name not in busy and name not in taken:
                    taken.append(name)
            for name in dropped:
                del queue[name]
        for name in taken:
            self._touched.pop(name, None)
            self._rest.pop(name, None)
        return taken


class ParamsWriter:
    """Renders the namespaces that changes touched and writes them while the lease is held."""

    def __init__(
        self,
        client: KubeClient,
        lease: LeaderLease,
        options: Options,
        max_bytes: int = MAX_BYTES,
        discover: Callable[[KubeClient], Iterable[Resource]] | None = None,
        max_work: int = MAX_WORK,
        coverage: CoverageWriter | None = None,
        snapshots: Callable[[], Snapshot | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        compile_softened: bool = False,
        policies: PolicyWriter | None = None,
        install: Install = SHIPPED,
    ) -> None:
        self._client = client
        self.policies = policies or PolicyWriter(
            client, policy_names(compile_softened), clock, install
        )
        self.policies.on_change = self._wake_up
        # What of the cluster part decides every namespace's render (``_keep_cluster``), and
        # the namespaces written while the policies were not: marked once they are.
        self._cluster_summary: tuple[object, ...] | None = None
        self._to_mark: set[str] = set()
        # A namespace where a mode softens a denial is left to the webhook unless asked
        # (``--compile-softened``, for installs with the warn and audit policies).
        self._delegate_softened = not compile_softened
        self._clock = clock
        # The newest snapshot, for namespaces touched while a step is writing (by default the
        # one the step was given).
        self._snapshots = snapshots
        self._lease = lease
        self._options = options
        self._max_bytes = max_bytes
        self._max_work = max_work
        self._discover = discover or ServedResources()
        self._coverage = coverage
        # What discovery found (``_base``), and that with what every namespace indexes
        # (``_target``, rendered for).
        self._base: Target | None = None
        self._target: Target | None = None
        # What the annotations restrict (keys), and the index last computed, with what from.
        self._restricted: frozenset[str] = frozenset()
        self._lingering: dict[str, float] = {}  # key → when last seen restricted
        self._indexed_for: tuple[tuple[object, ...], frozenset[str], tuple[Resource, ...]] | None
        self._indexed_for = None
        # What the ClusterRoles' annotations restrict, with what from (``_settle``).
        self._cluster_named: tuple[tuple[object, ...], frozenset[Resource]] | None = None
        # Indexed resources the policies still let pass unjudged until every namespace indexes
        # them (``params.settling``), and the part last written with them; whether they are
        # read from the policy in force first (a new leader's).
        self._settling: frozenset[Resource] = frozenset()
        self._settled_part: tuple[ClusterPart, frozenset[str], ClusterPart] | None = None
        self._adopting = False
        # The marked namespaces not written since they last grew (``_settled``; one no longer
        # marked, or gone, leaves it: ``_record``, ``gone``), and how many times they grew;
        # whether they grew at the last step, and until when the namespaces no change touched
        # wait for the policies holding the cluster part for them (``step``).
        self._unsettled: set[str] = set()
        self._generation = 0
        self._grew = False
        self._rest_from = float("-inf")
        # The namespaced resources discovery last listed (the coverage is computed over them).
        self.served: tuple[Resource, ...] = ()
        self._discovered_at = -DISCOVERY_INTERVAL
        self._rediscover_asked = 0  # how many times ``rediscover_soon`` was called
        self._pending = PendingNamespaces()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._written: dict[str, Written] = {}
        # Where the install's policies never judge: no probe of the enforcing one is sent there.
        self._unjudged = install.unjudged
        # Namespaces whose last write failed: (failures in a row, when to try again).
        self._retry: dict[str, tuple[int, float]] = {}
        # Namespaces whose Namespace object was created since the last step: their backoff
        # (grown while the namespace was being deleted) is forgotten.
        self._created: set[str] = set()
        self._failures_log, self._round_log = Throttled(), Throttled()
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="params-writer")
        # Writes in flight, carried from one step to the next (a step never waits for them all);
        # changed under ``_lock`` (``gone`` flags those of a namespace whose parameters went).
        self._running: dict[Future[Written | None], InFlight] = {}
        # The namespaces whose parameters were deleted while the stored ones were listed (a new
        # leader's ``_stored``), else None: what the list found there is gone.
        self._listing: set[str] | None = None
        # New parameters waiting to be proven seen by the policies, a batch at a time, and the
        # proof in flight (``app.compiled.proof``), with the batch it proves.
        self._unseen = Unseen(install.unjudged)
        self._proof: Future[None] | None = None
        self._proof_batch: dict[str, object] = {}
        self._proof_failures, self._proof_due = 0, 0.0
        # Discovery and the coverage run beside the writes: their reads (a request per API group,
        # the registration) never hold up a touched namespace.
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="beside")
        self._beside_due: Future[None] | None = None
        self._version = ""
        self._unreported, self._reported_at = 0, -REPORT_EVERY
        self.leading = False

    def applied(self, live: LiveSnapshot, changes: list[Change], version: str) -> None:
        """Called by the cluster source's builder after each batch: mark what it touches."""
        # Known before the builder derives the next snapshot from this one, so that each
        # derived snapshot updates them by its own role changes (``Snapshot.restrictions``).
        live.snapshot.restrictions()
        # The cluster part is compared with what the policies hold at every step.
        found = touched(live, changes) - {CLUSTER}
        created = {
            new[0]
            for kind, old, new in changes
            if CATEGORIES.get(kind) == NAMESPACES and old is None and new is not None
        }
        with self._lock:
            self._pending.add(found)
            self._created |= created
            self._version = version or self._version
        self._wake.set()

    def step(self, snapshot: Snapshot | None) -> int:
        """One round: keep the lease, then write the policies if the cluster part changed, and
        the pending namespaces. The namespaces written."""
        leading = self._lease.keep(self._lease.duration / 3)
        if leading and not self.leading:
            log.info("leading (lease %s/%s): rendering every namespace", *self._lease_name())
            with self._lock:
                self._pending.add(ALL)
                self._listing = set()
            stored, earlier = self._stored()
            with self._lock:
                deleted, self._listing = self._listing, None
                self._written = {n: w for n, w in stored.items() if n not in deleted}
            self._unseen.reset()
            self.policies.reset()
            self.policies.adopt(earlier)
            with self._lock:
                self._adopting = True
            if self._coverage is not None:
                self._beside.submit(self._coverage.reset)  # after any check running now
        elif self.leading and not leading:
            log.info("lost the lease; no longer writing")
        self.leading = leading
        if not leading or snapshot is None:
            return 0
        target = self._refresh_target(snapshot)
        # Before the writes too: a new restriction's coverage must not wait for a render of
        # every namespace.
        self._check_soon(snapshot)
        self._keep_cluster_settling(snapshot, target)
        done = self._write_pending(snapshot, target)
        if self._settled():  # the policies judge them now: every namespace indexes them
            self._keep_cluster(snapshot, target)
        self._report(done)
        self._check_soon(snapshot)
        return done

    def _keep_cluster(self, snapshot: Snapshot, target: Target) -> int:
        """Write the cluster part into the policies when it changed (before any namespace is
        written or marked); every namespace is rendered again only when what it decides there
        changed: whether it leaves them all to the webhook, or softens a denial."""
        part = self._with_settling(render_cluster(snapshot, target), target)
        summary = (part.delegated, part.reason, part.softened)
        written = self.policies.keep(part)
        with self._lock:
            if self._cluster_summary is not None and summary != self._cluster_summary:
                self._pending.add(ALL)
            self._cluster_summary = summary
            if self.policies.ready and self._to_mark:
                self._pending.add(self._to_mark)
                self._to_mark = set()
        return written

    def _keep_cluster_settling(self, snapshot: Snapshot, target: Target) -> None:
        """``_keep_cluster``; when ``_settling`` grew and the policies were written, the cluster
        part holds what grew: until the API server judges by it, a namespace indexing it would
        refuse the cluster's subjects ("do not list this user yet"), so the namespaces no change
        touched wait ``POLICY_LOADED`` seconds (those touched are written at once: the change
        restricts there)."""
        with self._lock:
            grew, self._grew = self._grew, False
        try:
            written = self._keep_cluster(snapshot, target)
        except KubeError:
            with self._lock:
                self._grew = self._grew or grew  # asked again at the next step
            raise
        if written and grew:
            with self._lock:
                self._rest_from = self._clock() + POLICY_LOADED

    def _settled(self) -> bool:
        """Whether ``_settling`` just emptied: every namespace the policies judge (marked) has
        been written since it last grew. One not marked is not judged by them (its mark waits
        for its parameters, which index it), so a namespace that cannot be marked holds
        nothing back."""
        with self._lock:
            if not self._settling or self._unsettled:
                return False
            self._settling = frozenset()
        return True

    def _with_settling(self, part: ClusterPart, target: Target) -> ClusterPart:
        """``part`` letting the ``_settling`` resources pass unjudged too: the same object for
        the same part and resources (the policies' text is built again only for a new one)."""
        with self._lock:
            keys = frozenset(map(resource_key, self._settling))
            last = self._settled_part
        if not keys:
            return part
        if last is not None and last[0] is part and last[1] == keys:
            return last[2]
        found = settling(part, target, keys)
        with self._lock:
            self._settled_part = (part, keys, found)
        return found

    def _wake_up(self) -> None:
        self._wake.set()

    def _check_soon(self, snapshot: Snapshot) -> None:
        """Start the checks beside the writes unless they are running, with what the policies
        in force may still let pass as needing no judging (``PolicyWriter.listed``)."""
        if self._beside_due is None or self._beside_due.done():
            listed = self.policies.listed(map(resource_key, self.served))
            self._beside_due = self._beside.submit(self._check_beside, snapshot, listed)

    def _report(self, done: int) -> None:
        """Log how many namespaces were written, at most every ``REPORT_EVERY`` seconds (under
        churn a step ends at every finished write; an idle writer still steps every few
        seconds, so the last writes are told too)."""
        self._unreported += done
        now = time.monotonic()
        if self._unreported and now - self._reported_at > REPORT_EVERY:
            log.info("wrote the parameters of %d namespaces", self._unreported)
            self._unreported, self._reported_at = 0, now

    def _check_beside(self, snapshot: Snapshot, listed: frozenset[str] = frozenset()) -> None:
        """Discovery when it is due, then the registration's coverage for ``snapshot`` and the
        keys the policies may let pass unjudged, ``listed`` (in the thread beside the
        writes)."""
        if not self._lease.current():
            return
        if self._clock() - self._discovered_at > DISCOVERY_INTERVAL:
            try:
                self._rediscover()
            except KubeError as exc:
                log.warning("discovery failed: %s", exc)
        if self._coverage is not None:
            try:
                self._coverage.step(snapshot, self.served, listed)
            except KubeError as exc:
                log.warning("could not update %s: %s", self._coverage.name, exc)

    def settle(self, timeout: float | None = None) -> None:
        """Wait for the writes in flight and the checks beside them (tests; shutting down)."""
        proof: list[Future[Any]] = [self._proof] if self._proof is not None else []
        wait([*self._running, *proof], timeout)
        if self._beside_due is not None:
            wait([self._beside_due], timeout)

    def _stored(self) -> tuple[dict[str, Written], frozenset[str] | None]:
        """What the parameters already say, as written: a replica taking the lease over renders
        every namespace, and writes only those that differ. Empty (write them all) when they
        cannot be read. And what those an earlier release wrote list unjudged themselves (None
        when they cannot be read: any resource)."""
        marked = f"{MARK}=true"
        listing: set[str] = set()
        try:
            found, _ = self._client.list_each(
                "/api/v1/namespaces", LIST_PAGE, LIST_TIMEOUT, _marks, metadata_only=True,
                selector=[("labelSelector", marked)],
            )  # fmt: skip
            pages = _PageSizer(PARAMS_PAGE_FIRST, PARAMS_PAGE_BYTES, LIST_PAGE)
            stored, _ = self._client.list_each(
                f"/apis/{API_VERSION}/{PLURAL}", pages.next, LIST_TIMEOUT,
                lambda obj: _stored_params(obj, pages.saw, listing),
            )  # fmt: skip
        except KubeError as exc:
            log.warning("could not read the parameters written so far: %s", exc)
            return {}, None
        # Parameters stored but not marked are proven seen before they are.
        compiled = dict(found)
        written_so_far = {
            namespace: replace(
                written,
                marked=namespace in compiled,
                seen=namespace in compiled,
                softened=compiled.get(namespace, False),
            )
            for namespace, written in stored
            if written is not None
        }
        return written_so_far, frozenset(listing)

    def _lease_name(self) -> tuple[str, str]:
        return self._lease.namespace, self._lease.name

    def _refresh_target(self, snapshot: Snapshot) -> Target:
        """What to render for: the served resources (the first discovery is made here, the next
        ones beside the writes, ``_check_beside``) and what every namespace indexes: what the
        annotations restrict, or did a moment ago. Every namespace is rendered again when it
        moved."""
        base = self._base or self._rediscover()
        restrictions = snapshot.restrictions()
        with self._lock:
            kept = self._lingering_keys()
            seen = (restrictions, base, kept)
            found = self._indexed_for
            if found is None or found[0][0] is not restrictions or found[0][1:] != seen[1:]:
                restricted = frozenset(map(resource_key, base.index(restrictions)))
                found = self._indexed_for = (seen, restricted, base.index(restrictions, kept))
            _, self._restricted, indexed = found
            # For an earlier release's policy still in force: the layout it reads.
            earlier = self.policies.earlier_in_force()
            target = replace(base, indexed=indexed, earlier=earlier)
            previous = self._target
            if previous is not None and target != previous:
                self._pending.add(ALL)
            self._target = target
            self._settle(previous, target, restrictions, base)
        return target

    def _settle(
        self, previous: Target | None, target: Target, restrictions: Restrictions, base: Target
    ) -> None:
        """Keep ``_settling`` (under the lock): the served resources ``target`` newly indexes
        join it (a Role's annotation restricts them now: the changes touched its namespace,
        written before the others), and it empties once every marked namespace has been written
        since (``_settled``). A new leader takes those the policy in force
        lets pass while indexed (its predecessor's pass was not done). A ClusterRole's
        restriction never settles: every namespace's roles may hand it out, so it is judged at
        once."""
        indexed = frozenset(target.indexed or ())
        grown: set[Resource] = set()
        adopted = self._adopting
        if adopted:
            listed = self.policies.in_force()
            grown = {r for r in indexed if listed is not None and resource_key(r) in listed}
            self._settling, self._adopting = frozenset(), False
        elif previous is not None and target != previous:
            # Not a resource served anew: where a role already restricted it, no change touched
            # the namespace, so it is refused there until written, never let pass.
            grown = set(indexed - frozenset(previous.indexed or ())) & set(previous.resources)
        if grown:
            self._settling |= grown
            self._generation += 1
            self._unsettled = {n for n, written in self._written.items() if written.marked}
        if not self._settling:
            return
        cluster = restrictions.cluster
        seen = (cluster, base)
        named_for = self._cluster_named
        if named_for is None or named_for[0][0] is not cluster or named_for[0][1] != base:
            found_named = named(cluster, base.resources) if cluster is not None else indexed
            named_for = self._cluster_named = (seen, frozenset(found_named))
        self._settling = (self._settling & indexed) - named_for[1]
        # A new leader's: the policy it found holds their cluster part already.
        self._grew = self._grew or (not adopted and bool(grown & self._settling))

    def _lingering_keys(self) -> frozenset[str]:
        """What was restricted less than ``KEEP_INDEXED`` seconds ago: it stays indexed, so an
        annotation entry put on and taken off again does not make every namespace be written
        each time. (Indexing more than is restricted is safe: every granting role is indexed,
        and an unrestricted one allows.)"""
        now = self._clock()
        for key in self._restricted:
            self._lingering[key] = now
        for key in [k for k, since in self._lingering.items() if now - since > KEEP_INDEXED]:
            del self._lingering[key]
        return frozenset(self._lingering)

    def _rediscover(self) -> Target:
        """List the served resources. A CRD that changed while they were being listed
        (``rediscover_soon``) may be missing from the list: then the next check lists them
        again, not the next interval."""
        with self._lock:
            asked, started = self._rediscover_asked, self._clock()
        served = tuple(self._discover(self._client))
        base = Target.of(
            served, self._options, self._max_bytes, self._max_work, self._delegate_softened
        )
        with self._lock:
            moved = self._base is not None and base != self._base
            self.served, self._base = served, base
            again = self._rediscover_asked != asked
            if not again:
                self._discovered_at = started
        if moved or again:
            self._wake.set()  # render for it (or list again) now, not at the next round
        return base

    def _due(self, rendered: Rendered, previous: Written | None) -> bytes:
        """The spec's digest when ``rendered`` differs from ``previous``, what was last written
        (content or mark), else empty."""
        found = digest(rendered.text)
        unchanged = (
            previous is not None
            and previous.spec == found
            and previous.marked != (rendered.delegated is not None)
            and previous.softened == rendered.softened
        )
        return b"" if unchanged else found

    def _take(self, snapshot: Snapshot, busy: set[str], most: int) -> list[str]:
        """Up to ``most`` pending namespaces of ``snapshot`` not being written now, no longer
        pending."""
        with self._lock:
            rest = self._clock() >= self._rest_from
            return self._pending.take(Namespaces(snapshot), busy, most, rest)

    def _waiting(self, known: Set[str]) -> set[str]:
        """The namespaces whose retry is not due yet; a namespace gone, or created again, is
        forgotten, and written at once (its deletion and creation may reach one snapshot, which
        then never lacks it)."""
        now = self._clock()
        with self._lock:
            created, self._created = self._created, set()
        for namespace in [n for n in self._retry if n not in known or n in created]:
            del self._retry[namespace]
        return {namespace for namespace, (_, due) in self._retry.items() if due > now}

    def _write_pending(self, snapshot: Snapshot, target: Target) -> int:
        """Render and write the pending namespaces, ``WRITERS`` at a time, as a pipeline: a
        namespace touched meanwhile is taken as soon as a writer is free (one being written is
        taken again after its write, so each namespace's writes stay in order). Rendering runs in
        the writers too, never on this thread, which keeps the lease: a namespace whose render is
        slow (bounded by ``Target.max_work``) holds one writer, not the others nor the lease.
        Returns when nothing is pending or in flight, or after a third of the lease (so the lease
        is renewed) with the writes in flight still running: the pipeline is never drained to
        renew. The parameters written; a namespace that fails is pending again, tried after a
        backoff (``backoff``); one left because the lease may have moved on, at the next step."""
        done = 0
        lost: set[str] = set()
        deadline = time.monotonic() + self._lease.duration / 3
        running = self._running
        while True:
            if self._lease.current():
                current = (self._snapshots() if self._snapshots else None) or snapshot
                busy = {f.namespace for f in running.values()} | lost
                busy |= self._waiting(Namespaces(current))
                busy.add(self._unseen.proving)
                taken = self._take(current, busy, WRITERS - len(running))
                # Many new namespaces: their proofs are batched (``app.compiled.proof``).
                with self._lock:
                    many = BATCH - len(taken) - len(running) - len(self._unseen)
                    bulk = self._unseen.batches and self._pending.at_least(many)
                for namespace in taken:
                    with self._lock:  # what was written and the write, as one to ``gone``
                        flight = InFlight(namespace, generation=self._generation)
                        previous = self._written.get(namespace)
                        future = self._pool.submit(
                            self._render_write, current, flight, target, previous, bulk
                        )
                        running[future] = flight
                    future.add_done_callback(lambda _: self._wake.set())
                self._start_proof({f.namespace for f in running.values()})
            left = deadline - time.monotonic()
            proof: list[Future[Any]] = [self._proof] if self._proof is not None else []
            if not (running or proof) or left <= 0:
                return done
            finished, _ = wait([*running, *proof], left, FIRST_COMPLETED)
            for future in finished:
                if future not in running:
                    continue
                with self._lock:
                    flight = running.pop(future)
                namespace = flight.namespace
                previous = self._written.get(namespace)
                result = self._result(namespace, future)
                if result is None:
                    with self._lock:
                        self._pending.add((namespace,))
                    if namespace not in self._retry:
                        lost.add(namespace)  # not before the next step
                elif self._record(flight, result) and result is not previous:
                    done += 1
            if self._proof is not None and self._proof in finished:
                self._proof_done()  # after the writes it proves are recorded

    def _record(self, flight: InFlight, result: Written) -> bool:
        """Remember ``result`` as what ``flight`` wrote, unless the parameters were deleted
        while it ran: the namespace is pending again then (``gone``), written anew."""
        with self._lock:
            if flight.deleted:
                return False
            self._written[flight.namespace] = result
            if flight.generation == self._generation or not result.marked:
                self._unsettled.discard(flight.namespace)
            return True

    def _result(self, namespace: str, future: Future[Written | None]) -> Written | None:
        """What the write gave; None (and a retry scheduled) when it failed. Parameters written
        but not marked yet (``Unmarked``) are what was written, with a retry scheduled too."""
        try:
            result = future.result()
        except KubeError as exc:
            failures = self._retry.get(namespace, (0, 0.0))[0] + 1
            delay = backoff(failures)
            self._retry[namespace] = (failures, self._clock() + delay)
            what = "mark" if isinstance(exc, Unmarked) else "write the parameters of"
            self._failures_log.warning(
                "could not %s %s (retrying in %.1fs): %s", what, namespace, delay, exc
            )
            if isinstance(exc, Unmarked):
                with self._lock:
                    self._pending.add((namespace,))
                return exc.written
            return None
        self._retry.pop(namespace, None)
        return result

    def _render_write(
        self,
        snapshot: Snapshot,
        flight: InFlight,
        target: Target,
        previous: Written | None,
        bulk: bool = False,
    ) -> Written | None:
        """Render ``flight``'s namespace and write it if it changed (in a writer thread):
        ``previous`` when nothing needed writing, None once the lease may have moved on."""
        rendered = render(snapshot, flight.namespace, target)
        if not (spec := self._due(rendered, previous)):
            return previous
        return self._write(rendered, spec, previous, flight, bulk)

    def _start_proof(self, busy: set[str]) -> None:
        """Start proving the new parameters waiting for it unless a proof is in flight or
        the last one failed less than its backoff ago."""
        if self._proof is not None or self._clock() < self._proof_due:
            return
        found = self._unseen.take(busy)
        if found is None:
            return
        sentinel, self._proof_batch = found
        path = f"/apis/{API_VERSION}/namespaces/{sentinel}/{PLURAL}/{NAME}"
        self._proof = self._pool.submit(prove, self._client, path, self._unseen.epochs)
        self._proof.add_done_callback(lambda _: self._wake.set())

    def _proof_done(self) -> None:
        """The proof finished: the namespaces it proves are written again (their mark is
        due); a failed one is tried again after a backoff, with what waits then."""
        assert self._proof is not None
        future, self._proof = self._proof, None
        try:
            future.result()
        except EpochUnchecked as exc:
            back = self._unseen.failed(unchecked=True)
            log.info("proving new parameters one namespace at a time (%s)", exc)
            with self._lock:
                self._pending.add(back)
            return
        except KubeError as exc:
            self._unseen.failed(unchecked=False)
            self._proof_failures += 1
            delay = backoff(self._proof_failures)
            self._proof_due = self._clock() + delay
            self._failures_log.warning(
                "could not prove new parameters seen (retrying in %.1fs): %s", delay, exc
            )
            return
        self._proof_failures = 0
        # Only what still waits with what the proof saw written: every write of a namespace
        # takes it out of the waiting (``_write``), so a newer one is never marked seen here.
        # As one to ``gone``, which takes a namespace out of the waiting and what was written.
        with self._lock:
            proven = self._unseen.proven(self._proof_batch)
            for namespace in proven:
                if (found := self._written.get(namespace)) is not None:
                    self._written[namespace] = replace(found, seen=True)
            self._pending.add(proven)

    def gone(self, namespace: str) -> None:
        """The parameters of ``namespace`` were deleted (the watch of them says so): write them
        again, whatever was written before. The namespace controller deletes them with their
        namespace; one created again under the same name must get them, or the policy refuses
        every write it matches there. What a write or list sent before now finds or writes
        there is gone too: flagged, it is never remembered, nor waits for a proof, when it
        ends (``_record``), so no stale memory skips the next write."""
        with self._lock:
            self._written.pop(namespace, None)
            self._unsettled.discard(namespace)
            self._unseen.discard(namespace)
            self._to_mark.discard(namespace)  # pending again: written, then queued again
            for flight in self._running.values():
                if flight.namespace == namespace:
                    flight.deleted = True
            if self._listing is not None:
                self._listing.add(namespace)
            self._pending.add((namespace,))
        self._wake.set()

    def _write(
        self,
        rendered: Rendered,
        spec: bytes,
        previous: Written | None,
        flight: InFlight,
        bulk: bool = False,
    ) -> Written | None:
        """Write a namespace's parameters, and its mark after them (before them when it loses
        it), so that at every moment the webhook or the policy judges its writes. New parameters
        are marked once the policies see them: proven here, or with ``bulk`` left to a proof of
        many (``app.compiled.proof``), unless ``flight`` says they were deleted meanwhile. None,
        writing nothing, once the lease may have moved on."""
        if not self._lease.current():
            return None
        # Newer parameters: a proof of the older ones, in flight, no longer stands for them.
        self._unseen.discard(rendered.namespace)
        delegated = rendered.delegated is not None
        marked = previous is None or previous.marked
        softened = previous is not None and previous.softened
        if delegated and marked:
            marked = softened = self._mark(rendered.namespace, False)
        elif marked and previous is not None and rendered.softened and not softened:
            # Before the parameters: once they soften a denial, the enforcing policy lets it
            # pass, and only the warn and audit policies, which select this label, record it.
            softened = self._mark(rendered.namespace, True, softened=True)
        path = f"/apis/{API_VERSION}/namespaces/{rendered.namespace}/{PLURAL}/{NAME}"
        # The condition's transition time stays while it says the same.
        since = _now().split(".")[0] + "Z"
        if previous is not None and previous.delegated == delegated and previous.since:
            since = previous.since
        body = {**rendered.manifest(), "status": self._status(rendered, since)}
        if previous is None or previous.spec != spec:  # else only the mark is due
            self._client.send("PATCH", path, body, _APPLY_QUERY, APPLY)
        if marked and softened and not rendered.softened:  # after them, for the same reason
            self._mark(rendered.namespace, True)
            softened = False
        if delegated and (previous is None or not previous.delegated):
            log.warning(
                "namespace %s is left to the webhook (%s, %d units of work): %s",
                rendered.namespace,
                rendered.reason,
                rendered.work,
                rendered.delegated,
            )
            self._event(rendered)
        written = Written(spec, delegated, marked, since, softened=softened)
        if delegated or (previous is not None and previous.marked):
            return written
        if previous is None or not previous.seen:
            if bulk:
                unseen = replace(written, marked=False, seen=False)
                with self._lock:  # not once deleted: no proof of them may mark it seen
                    if not flight.deleted:
                        self._unseen.add(rendered.namespace, unseen)
                return unseen
            self._seen(path, body)
        if not self.policies.ready:  # marked once the policies are written (``_keep_cluster``)
            with self._lock:
                self._to_mark.add(rendered.namespace)
            return replace(written, marked=False)
        if not self.policies.proven:
            unmarked = replace(written, marked=False)
            # Where the policies never judge, a probe would fail and hold back the others.
            if rendered.namespace in self._unjudged or not self.policies.claim_probe():
                raise Unmarked(unmarked, "the compiled policy is not known to be in force yet")
            try:
                self._probe(path)
            except ApiError as exc:
                self.policies.probed(False)
                raise Unmarked(unmarked, str(exc)) from None
            self.policies.probed(True)
        marked = self._mark(rendered.namespace, True, rendered.softened)
        return replace(written, marked=marked, softened=marked and rendered.softened)

    def _seen(self, path: str, body: Mapping[str, Any]) -> None:
        """Parameters created just now, written again: an update, which the API server admits
        only once the informer the policies read holds them (``label-rbac-params-visible``).
        Marked before, the namespace's plain writes would be judged by no one for that moment:
        the policy stands aside where it finds no parameters. That informer is a few
        milliseconds behind: tried again a few times, then the write fails (and is retried)."""

        def update() -> bool:
            self._client.send("PATCH", path, body, _APPLY_QUERY, APPLY)
            return True

        retried(update, (NOT_SEEN,), path)

    def _probe(self, path: str) -> None:
        """Prove, before marking the first namespace compiled since the enforcing policy was
        created, that the API server has loaded it (a marked namespace's plain writes are judged
        by the policy alone): a dry-run update of the namespace's parameters carrying
        ``PROBE_LABEL``, which that policy refuses once loaded, where it finds these parameters
        and judges the namespace (those it never judges by name, kube-system and the install's
        own, wait for a judged one to prove it; an exempt one's probe fails). Tried again a few
        times while admitted (not loaded yet) or refused as unseen, then the write fails (and is
        retried)."""
        body = {"metadata": {"labels": {PROBE_LABEL: "true"}}}
        query = [("dryRun", "All"), ("fieldManager", FIELD_MANAGER)]

        def refused() -> bool:
            try:
                self._client.send("PATCH", path, body, query, MERGE)
            except ApiError as exc:
                if PROBE_MESSAGE in exc.message:
                    return True
                raise
            return False

        not_yet = ApiError(503, "NotInForce", f"the compiled policy does not judge {path} yet")
        retried(refused, (NOT_SEEN,), path, not_yet)

    def _mark(self, namespace: str, compiled: bool, softened: bool = False) -> bool:
        """Label the Namespace compiled (and ``softened``: ``namespace_marks``), or take the
        labels off; whether it now carries the compiled one."""
        body = {"metadata": {"labels": namespace_marks(compiled, softened)}}
        query = [("fieldManager", FIELD_MANAGER)]
        try:
            self._client.send("PATCH", f"/api/v1/namespaces/{namespace}", body, query, MERGE)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return False  # no such Namespace: nothing to mark, nothing to unmark
        return compiled

    def _status(self, rendered: Rendered, since: str) -> dict[str, Any]:
        condition = {
            "type": CONDITION,
            "status": "False" if rendered.delegated else "True",
            "reason": rendered.reason if rendered.delegated else "Compiled",
            "message": rendered.delegated or "the label rule of this namespace is compiled",
            "lastTransitionTime": since,
        }
        return {
            "observedResourceVersion": self._version,
            "grants": rendered.grants,
            "bytes": rendered.size,
            "conditions": [condition],
        }

    def _event(self, rendered: Rendered) -> None:
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{NAME}.", "namespace": rendered.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": "LabelRbacParams",
                "name": NAME,
                "namespace": rendered.namespace,
            },
            "reason": rendered.reason,
            "message": rendered.delegated,
            "type": "Warning",
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": _now().split(".")[0] + "Z",
            "lastTimestamp": _now().split(".")[0] + "Z",
            "count": 1,
        }
        try:
            self._client.send("POST", f"/api/v1/namespaces/{rendered.namespace}/events", event)
        except KubeError as exc:
            log.warning("could not record an Event in %s: %s", rendered.namespace, exc)

    def round_failed(self, exc: KubeError, delay: float) -> None:
        self._round_log.warning("compile round failed (retrying in %.1fs): %s", delay, exc)

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def rediscover_soon(self) -> None:
        """Discovery at the next step (a CRD changed), whenever the last one was, and after the
        one running now, if any (``_rediscover``)."""
        with self._lock:
            self._discovered_at = float("-inf")
            self._rediscover_asked += 1
        self._wake.set()

    def caught_up(self) -> bool:
        """Nothing pending and nothing in flight (the compiler's lag metric)."""
        with self._lock:
            return not self._running and self._pending.empty()

    def delegated_count(self) -> int:
        """Namespaces last written delegated (the compiler's metrics)."""
        return sum(1 for written in list(self._written.values()) if written.delegated)


def policy_names(compile_softened: bool) -> tuple[str, ...]:
    """The policies the compiler writes: the enforcing one, and with ``--compile-softened`` the
    warn and audit ones (``manifests/compiled/modes`` binds them)."""
    return tuple(ACTIONS) if compile_softened else (POLICY,)


def _rbac_version(source: ClusterSource) -> str:
    """The newest resourceVersion the RBAC informers have seen (etcd revisions)."""
    versions = [int(i.resource_version) for i in source.informers if i.resource_version.isdigit()]
    return str(max(versions)) if versions else ""


def _params_namespace(obj: Mapping[str, Any]) -> str:
    """The namespace of a stored ``LabelRbacParams`` of the compiler's (metadata only); "" for
    another object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "") if meta.get("name") == NAME else ""


def _nothing() -> None:
    """The watch of the parameters rebuilds nothing: deletions are told one by one."""


def params_informer(client: KubeClient, writer: ParamsWriter, tuning: Tuning) -> Informer:
    """A metadata-only watch of the stored parameters, telling ``writer`` of each one deleted
    (``ParamsWriter.gone``): what the compiler remembers having written is otherwise never
    compared with what is stored."""
    group, version = API_VERSION.split("/")
    spec = KindSpec(KIND, group, PLURAL, lambda _c, o: _params_namespace(o), version)

    def deleted(old: object, new: object) -> None:
        if new is None and isinstance(old, str) and old:
            writer.gone(old)

    return MetadataInformer(spec, client, _params_namespace, _nothing, tuning, on_update=deleted)


def run(
    client: KubeClient,
    settings: Settings,
    lease: LeaderLease,
    stop: threading.Event,
    max_bytes: int = MAX_BYTES,
    max_work: int = MAX_WORK,
    health: CompilerHealth | None = None,
    compile_softened: bool = False,
    install: Install = SHIPPED,
) -> None:
    """Watch, render and write until ``stop`` is set; each round reported to ``health``
    (``app.compiled.health``: the probes and metrics); ``install``: the names of the policies
    it writes (the chart's ``name``) and the namespace they leave out."""
    coverage = CoverageWriter(client, FIELD_MANAGER, settings.webhook_configuration)
    writer = ParamsWriter(
        client,
        lease,
        settings.engine_options,
        max_bytes,
        coverage=coverage,
        snapshots=lambda: source.snapshot(),
        max_work=max_work,
        compile_softened=compile_softened,
        install=install,
    )

    def applied(live: LiveSnapshot, changes: list[Change]) -> None:
        writer.applied(live, changes, _rbac_version(source))
        if health is not None:
            health.changed()

    tuning = Tuning(start_wait=0)
    source = ClusterSource(client, settings.compiler, tuning=tuning, on_applied=applied)
    stored = params_informer(client, writer, tuning)
    watched = policy_informers(client, writer.policies, tuning)
    # CRDs, watched only to discover a new one at once: until discovery lists it, its writes go
    # to the webhook in compiled namespaces.
    crds = Informer(CRDS, client, partial(_crd, None), writer.rediscover_soon, tuning)
    if health is not None:
        health.watching(source.status)
    source.start()
    stored.start()
    for informer in watched:
        informer.start()
    crds.start()
    retry = max(0.2, lease.duration / 6)
    failures = 0
    try:
        while not stop.is_set():
            written = 0
            try:
                written = writer.step(source.snapshot())
                failures = 0
            except KubeError as exc:
                # Backed off, but never past a third of the lease: a lease kept must be renewed.
                failures += 1
                delay = backoff(failures, retry / 2, lease.duration / 3)
                writer.round_failed(exc, delay)
                if health is not None:
                    health.failed()
                stop.wait(delay)
                continue
            if health is not None:
                health.round(writer.leading, written, writer.caught_up(), writer.delegated_count())
            writer.wait(retry)  # woken by a change, or a write finished
    finally:
        writer.settle(lease.duration)
        crds.stop()
        for informer in watched:
            informer.stop()
        stored.stop()
        source.stop()
