"""Compile time and parameter bytes of the compiled policy at 1k, 10k and 100k RBAC objects.

The compiler (``label-rbac compile``) keeps one ``LabelRbacParams`` object per namespace,
rendered by ``app.engine.params.render`` from the snapshot the webhook decides on. For each size
the objects of the scale benchmark's layout (``bench.core.layout``: per tenant namespace a
Namespace, three Roles, four RoleBindings; per 500 objects a ClusterRole with a wildcard
annotation and its ClusterRoleBinding) are compiled into a ``LiveSnapshot`` as the cluster
source builds it, then measured in CPU seconds of this process:

- **full**: rendering every namespace (what a compiler does when it starts or takes the lease
  over), next to indexing the same objects whole (``LiveSnapshot.build``), the work every
  replica does at start anyway; total, mean and largest parameter bytes and grants. Every
  namespace of the layout is alike, so above ``--sample`` namespaces an evenly spread sample of
  that many is rendered and the full render's time and total bytes are the sample's scaled to
  every namespace (printed with ``~``);
- **incremental**: one change applied as the watch applies it, then the namespaces it touches
  rendered (``params.touched``): a Role's annotation edited, a RoleBinding created, a
  ClusterRole's annotation edited (bound cluster-wide: the cluster part, which the policy holds
  once, rendered again, and the namespaces binding it by RoleBindings).

The resources rendered for are the namespaced ones a kube-apiserver v1.36 serves with ``create``
(its discovery, as ``app.compiled.compiler.served_resources`` reads it), less those the policy
leaves to the webhook. ``--profile`` prints where the largest size's full render goes (cProfile).

    python -m bench compile --sizes 1000,10000,100000 [--sample 2000] [--json FILE] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from app.engine.incremental import Change, LiveSnapshot
from app.engine.kinds import BY_KIND
from app.engine.params import ALL, CLUSTER, Target, namespaces_of, render, render_cluster, touched
from app.settings import Settings
from bench.core.compiled import compiled_objects, target
from bench.core.layout import ANNOTATION, cluster_objects, layout, namespace_objects


def cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def render_all(live: LiveSnapshot, names: Iterable[str], goal: Target) -> list[tuple[int, int]]:
    """(bytes, grants) of each namespace's parameters, rendered in turn."""
    found = []
    for namespace in sorted(names):
        rendered = render(live.snapshot, namespace, goal)
        found.append((rendered.size, rendered.grants if rendered.delegated is None else -1))
    return found


def sample(names: Iterable[str], most: int) -> list[str]:
    """At most ``most`` of ``names``, evenly spread."""
    ordered = sorted(names)
    step = max(1, -(-len(ordered) // most))
    return ordered[::step]


def one_change(live: LiveSnapshot, kind: str, obj: dict[str, Any]) -> list[Change]:
    """The change a watch event of ``obj`` makes, against what ``live`` holds."""
    compiled = BY_KIND[kind].compile(Settings().compiler, obj)
    if kind == "RoleBinding":
        return [(kind, None, compiled)]
    return [(kind, live.snapshot.roles[compiled.ref], compiled)]


def changes_of(objects: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """One change of each kind measured: (kind, the object as the watch reports it)."""
    namespaces, cluster_roles = layout(objects)
    i = namespaces // 2
    docs = {(o["kind"], o["metadata"]["name"]): o for o in namespace_objects(i, cluster_roles)}
    role = docs[("Role", "team-own")]
    role["metadata"]["annotations"][ANNOTATION] = json.dumps(
        {"configmaps": {"team": [f"t{i}-x"]}, "pods": {"team": [f"t{i}-*"]}}
    )
    binding = docs[("RoleBinding", "team-own")]
    binding["metadata"]["name"] = "churn-new"
    binding["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                            "name": "new-user"}]  # fmt: skip
    cluster_role = cluster_objects(cluster_roles)[0]
    cluster_role["metadata"]["annotations"][ANNOTATION] = json.dumps(
        {"*": {"team": ["*"]}, "configmaps": {"env": ["p1"]}}
    )
    return {
        "role annotation": ("Role", role),
        "new rolebinding": ("RoleBinding", binding),
        "clusterrole annotation": ("ClusterRole", cluster_role),
    }


def measure(objects: int, rounds: int, most: int) -> dict[str, Any]:
    goal = target()
    compiled, count = compiled_objects(objects)
    index_s, live = cpu(lambda: LiveSnapshot.build(compiled))
    names = namespaces_of(live.snapshot)
    some = sample(names, most)
    scale = len(names) / len(some)
    full: list[float] = []
    rendered: list[tuple[int, int]] = []
    for _ in range(rounds):
        seconds, rendered = cpu(lambda: render_all(live, some, goal))
        full.append(seconds * scale)
    sizes = [size for size, _ in rendered]
    figures: dict[str, Any] = {
        "objects": count,
        "namespaces": len(names),
        "rendered": len(some),
        "index_s": round(index_s, 4),
        "full_render_s": round(statistics.median(full), 4),
        "per_namespace_ms": round(1000 * statistics.median(full) / len(names), 4),
        "params_total_bytes": round(sum(sizes) * scale),
        "params_mean_bytes": round(sum(sizes) / len(sizes)),
        "params_max_bytes": max(sizes),
        "grants_max": max(grants for _, grants in rendered),
        "delegated": round(scale * sum(1 for _, grants in rendered if grants < 0)),
        "incremental": {},
    }
    for name, (kind, obj) in changes_of(objects).items():
        changes = one_change(live, kind, obj)
        times: list[float] = []
        reach = 0
        for _ in range(rounds):
            start = time.process_time()
            after = live.apply(changes)
            hit = touched(after, changes)
            again = namespaces_of(after.snapshot) if hit >= ALL else hit - {CLUSTER}
            if CLUSTER in hit:
                render_cluster(after.snapshot, goal)
            chosen = sample(again, most)
            render_all(after, chosen, goal)
            spent = time.process_time() - start
            times.append(spent * len(again) / len(chosen) if chosen else spent)
            reach = len(again)
        figures["incremental"][name] = {
            "namespaces": reach,
            "cluster_part": CLUSTER in hit,
            "seconds": round(statistics.median(times), 5),
        }
    return figures


def profile(objects: int, top: int, most: int) -> str:
    goal = target()
    compiled, _ = compiled_objects(objects)
    live = LiveSnapshot.build(compiled)
    names = sample(namespaces_of(live.snapshot), most)
    profiler = cProfile.Profile()
    profiler.enable()
    render_all(live, names, goal)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=3, help="medians of this many renders")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument(
        "--sample",
        type=int,
        default=2000,
        help="render at most this many namespaces of a size, scaled up",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the largest size")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    rows = []
    print(f"{'objects':>8} {'namespaces':>10} {'index s':>8} {'full render s':>13} "
          f"{'ms/ns':>6} {'total MB':>9} {'mean B':>7} {'max B':>7} {'grants':>6}")  # fmt: skip
    for size in sizes:
        f = measure(size, args.rounds, args.sample)
        rows.append(f)
        about = "~" if f["rendered"] < f["namespaces"] else " "
        print(f"{f['objects']:>8} {f['namespaces']:>10} {f['index_s']:>8.2f} "
              f"{about}{f['full_render_s']:>12.2f} {f['per_namespace_ms']:>6.2f} "
              f"{about}{f['params_total_bytes'] / 1e6:>8.1f} {f['params_mean_bytes']:>7} "
              f"{f['params_max_bytes']:>7} {f['grants_max']:>6}", flush=True)  # fmt: skip
        for name, inc in f["incremental"].items():
            print(f"{'':>8} one {name}: {inc['namespaces']} namespaces rendered again in "
                  f"{inc['seconds'] * 1000:.2f} ms of CPU", flush=True)  # fmt: skip
        if f["delegated"]:
            print(f"{'':>8} {f['delegated']} namespaces over the size limit (delegated)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.profile:
        print(profile(max(sizes), 25, args.sample))
    return 0


if __name__ == "__main__":
    sys.exit(main())
