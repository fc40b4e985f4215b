"""The API server's time to check a policy holding the cluster part as a constant, by encoding.

Every write of the enforcing policy is checked by the API server before it is stored (each
expression compiled), and compiled again before the API server judges by it; the cluster part's
constants are most of that policy's text. Through a real kube-apiserver v1.36 and etcd
(tests/kube/controlplane.py), this creates ``--rounds`` times, in turn, a policy whose only
variable is the first constant of the cluster part of K restricted ClusterRoles bound
cluster-wide (``bench.core.layout.cluster_grant``, as ``bench layout`` builds them), encoded:

- **shipped**: as ``app.engine.params.cluster_chunks`` writes it (maps of one type each, a label
  requirement's empty lists left out);
- **empty lists**: the same with every requirement's four lists, empty ones included (0.3.0);
- **one string**: its text as one string literal, the floor of any encoding of that size.

Then the enforcing policy whole, as the compiler writes it (``app.compiled.admission_policy``):
**policy** holding that cluster part, and **policy, no part** without one (what its own
expressions cost: the label rule's variables and match conditions).

Reported: the median seconds each create took (the API server's answer), and the code points
(of every expression, for a whole policy).

    python -m bench constants [--cluster-grants 200] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.compiled.admission_policy import POLICY as ENFORCING
from app.compiled.admission_policy import policy as enforcing_policy
from app.engine.kinds import snapshot_from_objects
from app.engine.params import ClusterPart, render_cluster
from app.settings import Settings
from bench.core.compiled import target
from bench.core.kube import Client
from bench.core.layout import cluster_grant
from tests.kube.controlplane import ADMIN, ControlPlane, User

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
LISTS = ("exact", "prefixes", "suffixes", "patterns")
# A label requirement as the shipped constant holds it: its key, then the lists it has.
REQUIREMENT = re.compile(r'\{"key":\[[^\]]*\](?:,"(?:' + "|".join(LISTS) + r')":\[[^\]]*\])*\}')


def cluster_part(grants: int) -> ClusterPart:
    """The cluster part of ``grants`` cluster-wide restricted roles."""
    objects = [(o["kind"], o) for i in range(grants) for o in cluster_grant(i)]
    snapshot = snapshot_from_objects(objects, Settings().compiler)
    return render_cluster(snapshot, target())


def constant(grants: int) -> str:
    """The first constant of the cluster part of ``grants`` cluster-wide restricted roles."""
    return cluster_part(grants).chunks[0]


def with_empty_lists(literal: str) -> str:
    """``literal`` with every label requirement's missing lists put back, empty."""

    def whole(found: re.Match[str]) -> str:
        text = found.group(0)
        missing = "".join(f',"{name}":[]' for name in LISTS if f'"{name}":' not in text)
        return text[:-1] + missing + "}"

    return REQUIREMENT.sub(whole, literal)


def encodings(literal: str) -> dict[str, str]:
    return {
        "shipped": literal,
        "empty lists": with_empty_lists(literal),
        "one string": json.dumps(literal),
    }


def shapes(grants: int) -> dict[str, tuple[dict[str, Any], int]]:
    """Each policy created, by name, with its code points: the constant's encodings (each a
    policy of its own, ``policy``), then the enforcing policy whole, with and without the
    cluster part."""
    whole_part = cluster_part(grants)
    found = {name: (policy(expression), len(expression))
             for name, expression in encodings(whole_part.chunks[0]).items()}  # fmt: skip
    for name, part in (("policy", whole_part), ("policy, no part", None)):
        whole = enforcing_policy(ENFORCING, part)
        found[name] = (whole, len("".join(expressions(whole["spec"]))))
    return found


def expressions(value: Any) -> list[str]:
    """Every CEL expression ``value`` (a policy's spec, or part of it) holds."""
    if isinstance(value, list):
        return [text for item in value for text in expressions(item)]
    if not isinstance(value, dict):
        return []
    found = [v for k, v in value.items() if k.endswith(("expression", "Expression"))]
    nested = [v for v in value.values() if isinstance(v, list | dict)]
    return found + [text for v in nested for text in expressions(v)]


def policy(expression: str) -> dict[str, Any]:
    rule = {"apiGroups": ["bench.example"], "apiVersions": ["*"], "operations": ["CREATE"],
            "resources": ["things"]}  # fmt: skip
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "bench"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "variables": [{"name": "cluster", "expression": expression}],
            "validations": [{"expression": "size(variables.cluster) > 0"}],
        },
    }


def measure(
    admin: Client, shaped: dict[str, tuple[dict[str, Any], int]], rounds: int
) -> dict[str, list[float]]:
    """Seconds of each create, by shape, the shapes taken in turn."""
    seconds: dict[str, list[float]] = {name: [] for name in shaped}
    for r in range(rounds):
        for n, (name, (body, _)) in enumerate(shaped.items()):
            named = {**body, "metadata": {**body["metadata"], "name": f"bench-{r}-{n}"}}
            started = time.monotonic()
            status, answer = admin.send("POST", POLICIES, named)
            if status != 201:
                raise RuntimeError(f"{name}: {status} {answer}")
            seconds[name].append(time.monotonic() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster-grants", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    shaped = shapes(args.cluster_grants)
    workdir = Path(tempfile.mkdtemp(prefix="bench-constants-"))
    cp = ControlPlane(workdir, users=(User(ADMIN, ("system:masters",)),))
    cp.start(timeout=180)
    try:
        seconds = measure(Client(cp.url, cp.ca, cp.users[ADMIN].token), shaped, args.rounds)
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = [
        {"encoding": name, "code_points": shaped[name][1],
         "median_s": round(statistics.median(found), 3), "seconds": [round(s, 3) for s in found]}
        for name, found in seconds.items()
    ]  # fmt: skip
    for row in rows:
        print(f"{row['encoding']:<15} {row['code_points']:>8,} code points  "
              f"{row['median_s']:.3f} s to create (median of {args.rounds})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
