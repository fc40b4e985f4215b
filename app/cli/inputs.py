"""What the commands share: the policy flags as ``Settings``, RBAC read from a directory or
a cluster (found as kubectl finds it), and the one-line error every bad input ends in."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from app.engine.catalog import BUILTIN, ApiKind, Catalog, crd_kinds
from app.engine.context import MetadataLookup, ParentLookup, no_metadata_lookup, no_parent_lookup
from app.engine.kinds import BINDING_KINDS, ROLE_KINDS, snapshot_from_objects
from app.engine.model import Resource
from app.engine.placement import DEFAULT_PLACEMENT_KEY
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Snapshot
from app.settings import Settings
from app.source.static import read_manifests

if TYPE_CHECKING:  # the official client is imported only to talk to a cluster (it is slow)
    from app.source.api import KubeClient
    from app.source.lease import LeaderLease


class CliError(Exception):
    """A bad input or an unreachable source: printed as one line, exit status 2."""


def policy_settings(args: argparse.Namespace, **extra: object) -> Settings:
    return Settings(
        annotation_keys=tuple(args.annotation_keys or (DEFAULT_ANNOTATION_KEY,)),
        placement_keys=tuple(getattr(args, "placement_keys", None) or (DEFAULT_PLACEMENT_KEY,)),
        default_label_key=args.default_label_key,
        allow_unlabeled=args.allow_unlabeled,
        unrestricted_reads=tuple(args.unrestricted_reads),
        mode=args.mode,
        **extra,  # type: ignore[arg-type]
    )


@dataclass
class Loaded:
    """RBAC read for one command, from a directory or a cluster."""

    snapshot: Snapshot
    where: str
    objects: list[tuple[str, Mapping[str, Any]]]  # the directory's objects (none from a cluster)
    client: KubeClient | None = None
    # Objects a decision reads besides the request: from the cluster, or none (a directory).
    lookup: ParentLookup = no_parent_lookup
    metadata: MetadataLookup = no_metadata_lookup


def kube_connection(kubeconfig: Path | None) -> tuple[Path | None, bool]:
    """(kubeconfig, in-cluster) as kubectl chooses: the flag, $KUBECONFIG, ~/.kube/config,
    else the pod's service account."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise CliError(f"--kubeconfig {kubeconfig}: no such file")
        return kubeconfig, False
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"]), False
    default = Path.home() / ".kube" / "config"
    if default.is_file():
        return default, False
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None, True
    raise CliError(
        "no RBAC to read: pass --rbac-dir DIR or --kubeconfig FILE "
        "(or set $KUBECONFIG, have ~/.kube/config, or run in a pod)"
    )


def load_rbac(args: argparse.Namespace, settings: Settings) -> Loaded:
    from app.source.listing import cluster_snapshot

    if args.rbac_dir is not None:
        directory: Path = args.rbac_dir
        if not directory.exists():
            raise CliError(f"--rbac-dir {directory}: no such directory")
        if not directory.is_dir():
            raise CliError(f"--rbac-dir {directory}: not a directory")
        try:
            objects = read_manifests(directory)
        except OSError as exc:
            raise CliError(f"--rbac-dir {directory}: {exc.strerror or exc}") from None
        rbac_kinds = {spec.kind for spec in (*ROLE_KINDS, *BINDING_KINDS)}
        if not any(kind in rbac_kinds for kind, _ in objects):
            raise CliError(
                f"--rbac-dir {directory}: no Role, ClusterRole, RoleBinding or "
                "ClusterRoleBinding in it, so there is nothing to decide from"
            )
        return Loaded(snapshot_from_objects(objects, settings.compiler), str(directory), objects)
    from app.source.api import ConfigError, KubeClient, KubeError
    from app.source.cluster import ClusterSource

    kubeconfig, in_cluster = kube_connection(args.kubeconfig)
    if args.context and in_cluster:
        raise CliError("--context needs a kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config)")
    try:
        client = KubeClient.connect(kubeconfig, in_cluster, args.context)
    except ConfigError as exc:
        where = f"{kubeconfig}: " if kubeconfig else ""
        raise CliError(f"{where}{exc}") from None
    try:
        snapshot = cluster_snapshot(client, settings.compiler)
    except KubeError as exc:
        raise CliError(f"cannot read RBAC from {client.host}: {exc}") from None
    # The watch cache's lookups, without its watches: parents and metadata read on demand.
    reader = ClusterSource(client, settings.compiler)
    return Loaded(snapshot, client.host, [], client, reader.fetch_parent, reader.fetch_metadata)


# RBAC takes any verb (``bind``, ``escalate``, ``use``, a custom one) and so do ``check`` and
# ``who-can``: a verb the label rule does not restrict is answered by RBAC alone. Only its
# spelling is checked, so no blank, slash or control character reaches an answer or a table.
_VERB = re.compile(r"\*|[A-Za-z0-9][-A-Za-z0-9:._]{0,62}")


def verb_arg(text: str) -> str:
    if not _VERB.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid verb {text!r}: expected an RBAC verb, e.g. get, create, bind or *"
        )
    return text


def one_line(text: str) -> str:
    return " ".join(text.split())


def served(loaded: Loaded) -> Catalog:
    """The resources the source serves: a cluster's by discovery, a directory's as a built-in
    API server serves them, with the directory's CustomResourceDefinitions."""
    if loaded.client is None:
        return Catalog([*BUILTIN, *crd_kinds(loaded.objects)])
    from app.source.api import KubeError
    from app.source.listing import discover

    try:
        found = discover(loaded.client)
    except KubeError as exc:
        raise CliError(f"cannot read API discovery at {loaded.where}: {exc}") from None
    discovered = [ApiKind(r.group, r.resource, r.kind, r.namespaced, r.short_names) for r in found]
    # Discovery lists what can be listed; reviews and RBAC's identities are served too.
    return Catalog([*discovered, *BUILTIN])


def known(catalog: Catalog, resource: Resource, where: str) -> ApiKind:
    """The served resource ``resource`` names, or an error naming the close matches."""
    found = catalog.find(resource)
    if found is not None:
        return found
    matches = catalog.close_matches(resource)
    hint = f"; did you mean {' or '.join(matches)}?" if matches else ""
    raise CliError(f'the server doesn\'t have a resource type "{resource}" ({where}){hint}')


def context_namespace(args: argparse.Namespace) -> str:
    """The namespace of the kubeconfig context kubectl would use (``--context``, else the
    current one), else the pod's own namespace in a pod, else ""."""
    kubeconfig = getattr(args, "kubeconfig", None)
    paths = [kubeconfig] if kubeconfig else []
    if not paths and os.environ.get("KUBECONFIG"):
        paths = [Path(p) for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
    if not paths:
        paths = [Path.home() / ".kube" / "config"]
    for path in paths:
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # an unreadable kubeconfig names no namespace; connecting reports it
        if not isinstance(config, Mapping):
            continue
        name = args.context or config.get("current-context")
        for entry in config.get("contexts") or ():
            context = entry.get("context") if isinstance(entry, Mapping) else None
            if entry.get("name") == name and isinstance(context, Mapping):
                namespace = context.get("namespace")
                return namespace if isinstance(namespace, str) else ""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def leader_lease(args: argparse.Namespace, client: KubeClient) -> LeaderLease:
    """The Lease of a leader-elected controller, from its ``--lease-*`` and ``--identity``."""
    from app.source.lease import LeaderLease, identity

    return LeaderLease(
        client,
        args.lease_namespace,
        args.lease_name,
        args.identity or identity(),
        duration=args.lease_seconds,
    )
