"""Keep the webhook registration's label-rule entries off the resources no annotation restricts.

The compiler's leader also owns one matchCondition, ``skip-unjudged``, in each label-rule entry
of the ValidatingWebhookConfiguration (``LABEL_ENTRIES`` present in the live object): it skips
the resources ``app.engine.coverage.unjudged`` finds, for everyone but node users (a kubelet's
writes reaching the entry run the node rules). So a webhook outage blocks only the writes a
label restriction may concern. The same keys are recorded in the ``labelrbac.io/unjudged``
annotation, in the same server-side apply, where the webhook reads them to fence widening RBAC
writes (``app.engine.coverage.check_coverage``).

In the entry for compiled namespaces (``labels-compiled.labelrbac.io``, added by
``manifests/compiled/split``) the condition is evaluated only for what that entry's rules send
the webhook there: the resources and subresources the compiled policy never judges
(``app.compiled.admission_policy.compiled_rules``).

Written as field manager ``label-rbac-compiler``: webhooks and matchConditions are lists keyed by
name, so the apply owns that condition and the annotation only, and an administrator applying
the shipped manifest again leaves them in place. The writer never creates the configuration or
an entry: when either is missing it logs and tries again later. An expression that would exceed
``MAX_EXPRESSION`` is never truncated: nothing is skipped then (fail closed), and the log says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.context import UNJUDGED_ANNOTATION
from app.engine.coverage import unjudged
from app.engine.model import Resource
from app.engine.rbac import Restrictions, Snapshot
from app.source.api import ApiError, KubeClient, KubeError

log = logging.getLogger("label_rbac.compile")

# What the coverage was computed from: the roles' restrictions, the served resources and what
# the policies may let pass unjudged.
Seen = tuple[Restrictions, tuple[Resource, ...], frozenset[str]]

# The label-rule entries: the shipped one, and the one for compiled namespaces.
LABEL_ENTRIES = ("labels.labelrbac.io", "labels-compiled.labelrbac.io")
COMPILED_ENTRY = LABEL_ENTRIES[1]
CONDITION = "skip-unjudged"
# The condition earlier releases' compilers kept in the compiled entry (the resources the policy
# judged, before the entry's rules said it). Its apply leaves it out, so the apply removes it; the
# guard lets the compiler remove it, never add or change it.
RETIRED = ("left-by-the-policy",)
# The operations the compiled policy judges (its matchConstraints).
OPERATIONS = ("CREATE", "UPDATE", "DELETE")
# A kubelet, as the policy and the split webhook entry both say it.
NODE = "has(request.userInfo.groups) && 'system:nodes' in request.userInfo.groups"
API = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
APPLY = "application/apply-patch+yaml"
# cel-go's parser refuses an expression over 100,000 code points (its default, which the API
# server keeps), and the whole configuration shares etcd's 1.5 MiB with every other entry. A
# quarter of the parser's limit leaves room for both, and for the API server's cost estimate
# of the membership test (linear in the list).
MAX_EXPRESSION = 25_000
# How often the live configuration is compared again when nothing changed here (someone may have
# edited or replaced it).
RECHECK_INTERVAL = 60.0
# How soon a configuration (or entry) found missing is looked for again.
RETRY_INTERVAL = 10.0

# The key of a request, built as the other conditions build it from ``request.resource``.
_KEY = (
    "request.resource.resource + (request.resource.group == '' ? '' : '.' + request.resource.group)"
)
_PREFIX = (
    f"(has(request.userInfo.groups) && 'system:nodes' in request.userInfo.groups) || !({_KEY} in ["
)
_SUFFIX = "])"


def _literal(text: str) -> str:
    """``text`` as a regular expression matching only itself, in RE2 and Python alike."""
    return "".join("\\" + ch if ch in "$\\.+*?()|[]{}^" else ch for ch in text)


# The generated shape, anchored at both ends (``\z``: RE2's end of text, as CEL ``matches``
# runs it): the list holds only quoted keys (``context.is_key``). The guard policy checks the
# compiler's writes against it (``admission_policy.registration_guard``); no double quote in it,
# so it fits a CEL raw string.
_QUOTED = "'[a-z0-9][-a-z0-9.]*'"
SHAPE = f"^{_literal(_PREFIX)}({_QUOTED}(, {_QUOTED})*)?{_literal(_SUFFIX)}\\z"
# The annotation as ``Coverage.body`` writes it (``json.dumps`` of the keys).
ANNOTATION_SHAPE = r'^\[("[a-z0-9][-a-z0-9.]*"(, "[a-z0-9][-a-z0-9.]*")*)?\]\z'


def expression(keys: Sequence[str]) -> str:
    """The condition sending everything but ``keys`` (and node users' writes) to the entry."""
    return _PREFIX + ", ".join(f"'{key}'" for key in keys) + _SUFFIX


@dataclass(frozen=True)
class Coverage:
    """What one apply writes: the keys left out, and why none are when the list is too long;
    the keys the annotation names (those, and what the policies may still let pass unjudged)."""

    keys: tuple[str, ...]
    oversized: int = 0  # the expression's length had the keys been written; 0 when they are
    fenced: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, keys: Sequence[str], limit: int = MAX_EXPRESSION, listed: Iterable[str] = ()
    ) -> Coverage:
        size = len(expression(keys))
        kept, oversized = (tuple(keys), 0) if size <= limit else ((), size)
        return cls(kept, oversized, tuple(sorted(set(kept) | set(listed))))

    def body(self, name: str, entries: Iterable[str]) -> dict[str, Any]:
        """The server-side apply body: the annotation and each entry's condition."""
        condition = {"name": CONDITION, "expression": expression(self.keys)}
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {
                "name": name,
                "annotations": {UNJUDGED_ANNOTATION: json.dumps(list(self.fenced))},
            },
            "webhooks": [{"name": entry, "matchConditions": [condition]} for entry in entries],
        }


def present_entries(configuration: Mapping[str, Any]) -> list[str]:
    """The label-rule entries the live configuration has, in ``LABEL_ENTRIES`` order."""
    names = {
        hook.get("name")
        for hook in configuration.get("webhooks") or ()
        if isinstance(hook, Mapping)
    }
    return [entry for entry in LABEL_ENTRIES if entry in names]


def _current(configuration: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the live configuration already says what ``body`` would write."""
    annotations = (configuration.get("metadata") or {}).get("annotations") or {}
    if annotations.get(UNJUDGED_ANNOTATION) != body["metadata"]["annotations"][UNJUDGED_ANNOTATION]:
        return False
    hooks = {
        h.get("name"): h for h in configuration.get("webhooks") or () if isinstance(h, Mapping)
    }
    for entry in body["webhooks"]:
        conditions = hooks.get(entry["name"], {}).get("matchConditions") or ()
        live = [{"name": c.get("name"), "expression": c.get("expression")} for c in conditions]
        if any(wanted not in live for wanted in entry["matchConditions"]):
            return False
        if any(c["name"] in RETIRED for c in live):
            return False
    return True


class CoverageWriter:
    """Renders the unjudged resources on each change and applies them while the lease is held."""

    def __init__(
        self,
        client: KubeClient,
        field_manager: str,
        name: str = "label-rbac",
        limit: int = MAX_EXPRESSION,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._field_manager = field_manager
        self.name = name
        self._limit = limit
        self._clock = clock
        # The snapshot and served resources last rendered, and their coverage.
        self._seen: Seen | None = None
        self._coverage: Coverage | None = None
        self._due = 0.0  # when the live object is read again even if nothing changed
        # What the last read found missing (the configuration, or its label-rule entries), "" if
        # nothing: until it is looked for again there is nowhere to write, whatever changes.
        self._missing = ""

    def reset(self) -> None:
        """Forget what was checked (a new leader compares the live object again)."""
        self._seen, self._coverage, self._due, self._missing = None, None, 0.0, ""

    def step(
        self, snapshot: Snapshot, served: Sequence[Resource], listed: Iterable[str] = ()
    ) -> bool:
        """Apply the coverage when the live configuration does not say it yet. Whether an apply
        was made. The live object is read when the coverage changed, and every
        ``RECHECK_INTERVAL`` seconds (``RETRY_INTERVAL`` while it is missing). ``listed``: what
        the policies in force may still let pass unjudged, which the annotation keeps naming
        (``PolicyWriter.listed``)."""
        # Only roles, what is served and what the policies list change the coverage; a
        # snapshot shares its restrictions with the previous one when a batch changed no role.
        seen = (snapshot.restrictions(), tuple(served), frozenset(listed))
        changed = self._seen is None or seen[0] is not self._seen[0] or seen[1:] != self._seen[1:]
        early = self._clock() < self._due
        if early and (not changed or self._missing):
            return False
        coverage = Coverage.of(unjudged(seen[0], served), self._limit, seen[2])
        if early and coverage == self._coverage:
            # Most role changes leave the coverage as it was: the live object was current at the
            # last read (or an apply of it is retried when due), so it is not read for them.
            self._seen = seen
            return False
        if coverage.oversized and coverage != self._coverage:
            log.warning(
                "the skip-unjudged condition would take %d characters, over the limit of %d: "
                "every resource stays sent to the webhook",
                coverage.oversized,
                self._limit,
            )
        try:
            configuration = self._client.get(f"{API}/{self.name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            return self._retry(seen, coverage, "not found")
        entries = tuple(present_entries(configuration))
        if not entries:
            return self._retry(
                seen, coverage, f"has none of the entries {', '.join(LABEL_ENTRIES)}"
            )
        if self._missing:
            log.info("ValidatingWebhookConfiguration %s found", self.name)
        body = coverage.body(self.name, entries)
        self._seen, self._coverage, self._missing = seen, coverage, ""
        self._due = self._clock() + RECHECK_INTERVAL
        if _current(configuration, body):
            return False
        query = [("fieldManager", self._field_manager), ("force", "true")]
        try:
            self._client.send("PATCH", f"{API}/{self.name}", body, query, APPLY)
        except KubeError:
            self._due = self._clock() + RETRY_INTERVAL  # refused or unreachable: try again soon
            raise
        log.info(
            "%s: %d resources no annotation restricts are skipped by %s",
            self.name,
            len(coverage.keys),
            ", ".join(entries),
        )
        return True

    def _retry(self, seen: Seen, coverage: Coverage, why: str) -> bool:
        """Nothing to write to: look again in ``RETRY_INTERVAL`` (said once, not at each look)."""
        if why != self._missing:
            log.warning("ValidatingWebhookConfiguration %s %s; will retry", self.name, why)
        self._seen, self._coverage, self._missing = seen, coverage, why
        self._due = self._clock() + RETRY_INTERVAL
        return False
