"""Command line: ``serve``, ``compile``, ``report``, ``check``, ``who-can``, ``audit``, ``test``,
``gen-certs``, ``lint`` and ``completion``.

``check``, ``who-can`` and ``audit`` read RBAC from ``--rbac-dir`` or from a cluster, as kubectl
finds one (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` and its current context, or the
pod's service account), and take kubectl's spellings (``--as``, ``--as-group``, ``-n``, ``-l``,
``-o``, ``-f``). Every bad input is one line on stderr and exit status 2, never a traceback.

This module holds the parser and the dispatch; each command runs in a module of its own
(``serve``, ``compile``, ``report``, ``check``, ``audit``, ``suite`` for ``test``, ``lint``,
``completion``), and ``inputs`` is what they share.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import app
from app.cli.audit import cmd_audit, cmd_who_can
from app.cli.check import OPERATION_FOR_VERB, cmd_check
from app.cli.compile import cmd_compile
from app.cli.completion import SHELLS, cobra, script
from app.cli.inputs import CliError, one_line, verb_arg
from app.cli.lint import cmd_lint
from app.cli.report import cmd_report
from app.cli.serve import cmd_gen_certs, cmd_serve
from app.cli.suite import cmd_test
from app.engine.catalog import BUILTIN
from app.engine.model import AUTHORIZED_VERBS, ENFORCE, MODES, Resource
from app.engine.params import MAX_BYTES, MAX_WORK
from app.engine.placement import DEFAULT_PLACEMENT_KEY
from app.engine.policy import (
    DEFAULT_ANNOTATION_KEY,
    AnnotationError,
    is_label_key,
    is_label_value,
    resource_pattern,
)
from app.engine.selectors import Selector, SelectorError, parse_selector
from app.reports.render import MAX_PASSES, MAX_RESULTS
from app.settings import Settings
from app.source.static import ManifestError


class UsageError(CliError):
    """A command line argparse refused; the message is the whole line."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (``prog: message``) like every other error, and
    a misspelled command or choice answered with the close ones (``did you mean check?``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        shown = ", ".join(map(repr, choices))
        raise argparse.ArgumentError(
            action, f"invalid choice: {value!r}{hint} (choose from {shown})"
        )


def _read_pattern(text: str) -> str:
    try:
        resource_pattern(text)
    except AnnotationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# Every argument is checked whole: ``fullmatch``, or ``whole()`` patterns (never ``$``, which
# also matches before a final newline), and numbers as ASCII digits only (``int`` and ``float``
# also take surrounding whitespace, other scripts' digits, ``nan`` and ``inf``).
# A sign passes, so that the range checks of ``serve`` say what is wrong with a negative value.
_COUNT = re.compile(r"-?[0-9]+")
_SECONDS = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)")


def _resource_name(text: str) -> str:
    if _resource_arg(text).subresource:
        raise argparse.ArgumentTypeError(f"{text!r}: name a resource, not a subresource")
    return text


def _key_arg(text: str) -> str:
    if not is_label_key(text):
        raise argparse.ArgumentTypeError(
            f"invalid key {text!r}: expected [prefix/]name as Kubernetes label and annotation "
            "keys are, e.g. team or labelrbac.io/permissions"
        )
    return text


def _count_arg(text: str) -> int:
    if not _COUNT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected a whole number")
    return int(text)


_BIND = re.compile(r"(?P<host>[0-9A-Za-z.:-]*):(?P<port>[0-9]{1,5})")


def _bind_arg(text: str) -> tuple[str, int]:
    found = _BIND.fullmatch(text)
    if found is None or not 0 < int(found["port"]) < 65536:
        raise argparse.ArgumentTypeError(
            f"invalid address {text!r}: expected HOST:PORT, e.g. 0.0.0.0:8080 or :8080"
        )
    return found["host"], int(found["port"])


def _seconds_arg(text: str) -> float:
    if not _SECONDS.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: expected seconds as a decimal number, e.g. 30 or 2.5"
        )
    return float(text)


def _policy_flags() -> _Parser:
    parent = _Parser(add_help=False)
    group = parent.add_argument_group("policy")
    group.add_argument(
        "--annotation-key",
        action="append",
        dest="annotation_keys",
        type=_key_arg,
        metavar="KEY",
        help=f"annotation with label permissions (repeatable; default {DEFAULT_ANNOTATION_KEY})",
    )
    group.add_argument(
        "--placement-key",
        action="append",
        dest="placement_keys",
        type=_key_arg,
        metavar="KEY",
        help=f"annotation with a placement (repeatable; default {DEFAULT_PLACEMENT_KEY})",
    )
    group.add_argument(
        "--default-label-key",
        type=_key_arg,
        metavar="KEY",
        help="label key for the list shorthand, e.g. sdewan-bucket-type",
    )
    group.add_argument(
        "--allow-unlabeled",
        action="store_true",
        help="let objects that lack a restricted label pass (migration aid)",
    )
    group.add_argument(
        "--unrestricted-reads",
        action="append",
        type=_read_pattern,
        default=[],
        metavar="PATTERN",
        help="resource pattern whose reads are not label-scoped, only its writes "
        "(repeatable; e.g. configmaps, *.apps)",
    )
    group.add_argument(
        "--mode",
        choices=MODES,
        default=ENFORCE,
        help="enforce denies; warn allows with a warning; audit allows and records an audit "
        "annotation (default enforce; roles may be softer with labelrbac.io/mode)",
    )
    return parent


# The verbs completion offers for ``check`` and ``who-can``: every verb a label permission
# narrows, and RBAC's own (any other verb is taken too: RBAC alone answers it).
_VERBS = sorted({*OPERATION_FOR_VERB, *AUTHORIZED_VERBS, "bind", "escalate", "use"})


# The built-in resources, as completion offers them.
_RESOURCES = tuple(sorted(str(kind.as_resource) for kind in BUILTIN))


def _verb(parser: argparse.ArgumentParser, *names: str, **more: Any) -> None:
    """A verb argument: any RBAC verb, completed from ``_VERBS``."""
    action = parser.add_argument(*names, type=verb_arg, metavar="VERB", **more)
    action.completions = tuple(_VERBS)  # type: ignore[attr-defined]


def _parser(prog: str = "python -m app") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="label-rbac: label-based permissions for Kubernetes")
    parser.add_argument("--version", action="version", version=f"label-rbac {app.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    policy = _policy_flags()

    serve = sub.add_parser("serve", parents=[policy], help="run the webhook (gunicorn, TLS)")
    serve.add_argument(
        "--bind", default="0.0.0.0:8443", metavar="HOST:PORT", help="address to serve HTTPS on"
    )
    serve.add_argument(
        "--workers", type=_count_arg, default=2, metavar="N", help="gunicorn worker processes"
    )
    serve.add_argument(
        "--threads", type=_count_arg, default=4, metavar="N", help="request threads per worker"
    )
    serve.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help="the serving certificate (PEM)"
    )
    serve.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM)")
    serve.add_argument(
        "--dev-tls",
        nargs="?",
        const=Path("dev-certs"),
        type=Path,
        metavar="DIR",
        help="generate a self-signed CA and serving cert into DIR (default ./dev-certs)",
    )
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--rbac-dir", type=Path, help="load RBAC objects from manifests here")
    source.add_argument(
        "--kubeconfig", type=Path, help="watch a cluster (default: $KUBECONFIG, or in-cluster)"
    )
    serve.add_argument(
        "--max-staleness",
        type=_seconds_arg,
        metavar="SECONDS",
        help="deny everything once the cluster state is older than this (default: off)",
    )
    serve.add_argument(
        "--node-authorizer",
        action="store_true",
        help="decide kubelets' reads from the pods bound to them (watches pods and PVs)",
    )
    serve.add_argument(
        "--watch-labels",
        action="append",
        type=_resource_name,
        default=[],
        metavar="RESOURCE[.GROUP]",
        help="keep the labels of this resource from a metadata-only watch, for label-scoped "
        "gets (repeatable; configmaps, secrets, pods, serviceaccounts and deployments.apps "
        "always are)",
    )
    serve.add_argument(
        "--webhook-configuration",
        default=Settings.webhook_configuration,
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose unjudged resources to read (cluster mode; "
        "default label-rbac)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=_count_arg,
        default=Settings.max_body_bytes,
        metavar="BYTES",
        help="refuse a review body larger than this",
    )
    _log_level(serve)
    serve.add_argument(
        "--drain-seconds",
        type=_seconds_arg,
        default=0.0,
        metavar="SECONDS",
        help="after SIGTERM, keep serving this long with /readyz at 503 (default 0)",
    )
    serve.add_argument(
        "--request-deadline",
        type=_seconds_arg,
        default=Settings.request_deadline,
        metavar="SECONDS",
        help="a connection's TLS handshake and request (headers and body) must arrive within "
        "this long of its accept, or of its next request's first byte (default 10)",
    )
    serve.add_argument(
        "--max-connections",
        type=_count_arg,
        default=Settings.max_connections,
        help="open connections per worker; past it the oldest one still waiting for its "
        "request is closed (default 1000)",
    )
    serve.add_argument(
        "--max-connections-per-peer",
        type=_count_arg,
        default=Settings.max_connections_per_peer,
        help="open connections per client address per worker, likewise (default 128)",
    )

    compile_ = sub.add_parser(
        "compile",
        parents=[policy],
        help="keep the compiled label rule's parameters in step with RBAC (leader-elected)",
    )
    _leader_flags(compile_, "label-rbac-compiler")
    compile_.add_argument(
        "--max-params-bytes",
        type=_count_arg,
        default=MAX_BYTES,
        metavar="BYTES",
        help="leave a namespace whose parameters would be larger to the webhook",
    )
    compile_.add_argument(
        "--max-params-work",
        type=_count_arg,
        default=MAX_WORK,
        metavar="UNITS",
        help="leave a namespace whose parameters would take more units of work (rules and "
        "resource names looked at) to render to the webhook",
    )
    compile_.add_argument(
        "--compile-softened",
        action="store_true",
        help="compile a namespace where a role's labelrbac.io/mode (or --mode) softens a denial "
        "too, for installs with the warn and audit policies (manifests/compiled/modes); by "
        "default the webhook keeps judging it",
    )
    compile_.add_argument(
        "--webhook-configuration",
        default=Settings.webhook_configuration,
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose label-rule entries skip the resources no "
        "annotation restricts (default label-rbac)",
    )
    compile_.add_argument(
        "--policy-name",
        default="label-rbac",
        metavar="NAME",
        help="the ValidatingAdmissionPolicy the compiler writes, its binding's policyName (with "
        "--compile-softened NAME-warn and NAME-audit too); the policies leave the compiler's own "
        "namespace (--lease-namespace) out (default label-rbac)",
    )
    compile_.add_argument(
        "--registration-only",
        action="store_true",
        help="keep only the registration's skip-unjudged conditions, no parameters (for installs "
        "without the compiled policies)",
    )
    compile_.add_argument(
        "--probe-bind",
        type=_bind_arg,
        metavar="HOST:PORT",
        help="serve /healthz, /readyz and /metrics over HTTP here (default: off)",
    )
    _log_level(compile_)

    report = sub.add_parser(
        "report",
        parents=[policy],
        help="keep the audit's findings as PolicyReports, one per namespace (leader-elected)",
    )
    _leader_flags(report, "label-rbac-reporter")
    report.add_argument(
        "--interval",
        type=_seconds_arg,
        default=2.0,
        metavar="SECONDS",
        help="at most one audit pass per this many seconds (default 2)",
    )
    report.add_argument(
        "--writes-per-second",
        type=_seconds_arg,
        default=20.0,
        metavar="N",
        help="report writes per second at most (default 20)",
    )
    report.add_argument(
        "--max-results",
        type=_count_arg,
        default=MAX_RESULTS,
        metavar="N",
        help="results per report; a namespace with more, or with more than 1 MB of results, "
        f"gets several reports (default {MAX_RESULTS})",
    )
    report.add_argument(
        "--max-pass-results",
        type=_count_arg,
        default=MAX_PASSES,
        metavar="N",
        help="pass results a namespace's reports list at most, one per compliant object or "
        f"role; more are counted in the summary only (default {MAX_PASSES})",
    )
    report.add_argument(
        "--include-system-namespaces",
        action="store_true",
        help="also audit and report kube-system, kube-public, kube-node-lease and the "
        "reporter's own namespace (--lease-namespace), left out by default",
    )
    report.add_argument(
        "--exclude-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="a namespace neither audited nor reported (repeatable)",
    )
    report.add_argument(
        "--openreports",
        action="store_true",
        help="also write openreports.io/v1alpha1 Report and ClusterReport",
    )
    report.add_argument(
        "--metrics-port", type=_count_arg, default=0, metavar="PORT",
        help="serve Prometheus metrics on this port (default: off)",
    )  # fmt: skip
    _log_level(report)

    rbac_source = _source_flags()
    check = sub.add_parser(
        "check",
        parents=[policy, rbac_source],
        help="explain one decision, like kubectl auth can-i with labels",
    )
    request = check.add_argument(
        "request",
        nargs="*",
        metavar="ARG",
        help="VERB RESOURCE[/NAME] or VERB RESOURCE NAME, as kubectl auth can-i takes them "
        "(instead of --verb, --resource and --name)",
    )
    # VERB, RESOURCE, then a free NAME.
    request.positions = (tuple(_VERBS), _RESOURCES, ())  # type: ignore[attr-defined]
    check.add_argument(
        "--review",
        type=Path,
        metavar="FILE",
        help="an AdmissionReview or SubjectAccessReview JSON file to decide",
    )
    check.add_argument(
        "-f", "--filename", metavar="FILE", help="the object to judge, a manifest file or - (stdin)"
    )
    check.add_argument(
        "--as", "--user", dest="user", metavar="USER", help="the user to ask for (required)"
    )
    check.add_argument(
        "--as-group",
        "--group",
        dest="group",
        action="append",
        default=[],
        metavar="GROUP",
        help="a group of the user (repeatable)",
    )
    _verb(check, "--verb", help="any RBAC verb (get, create, bind, a custom verb...)")
    check.add_argument(
        "--selector",
        type=_selector_arg,
        metavar="SELECTOR",
        help="a read's label selector, as kubectl -l takes it (list, watch, deletecollection)",
    )
    check.add_argument(
        "--resource",
        type=_resource_arg,
        help="res[.group][/subresource], spelled as RBAC names it",
    )
    check.add_argument(
        "--subresource",
        metavar="SUB",
        type=_subresource_arg,
        help="the subresource of the positional RESOURCE, e.g. exec or status",
    )
    check.add_argument("-n", "--namespace", default="", help="the namespace to ask in")
    check.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="ask in all namespaces (with the positional form, which defaults to the "
        "context's namespace as kubectl does)",
    )
    check.add_argument("--name", default="", help="the object's name")
    _labels_flag(check)
    check.add_argument(
        "--list",
        action="store_true",
        help="list what the user may do in the namespace and within which labels, as kubectl "
        "auth can-i --list",
    )
    check.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing: the exit status is the answer"
    )
    _output(check, ("text", "json", "yaml"), "text")
    check.add_argument(
        "--node-authorizer",
        action="store_true",
        help="decide kubelets' requests from the pods bound to them, as serve does",
    )

    who = sub.add_parser(
        "who-can",
        parents=[policy, rbac_source],
        help="who may do VERB on RESOURCE objects with these labels, and through which roles",
    )
    _verb(who, "verb", help="any RBAC verb (get, create, bind, a custom verb...)")
    resource = who.add_argument(
        "resource", metavar="RESOURCE", type=_resource_arg, help="res[.group][/subresource]"
    )
    resource.completions = _RESOURCES  # type: ignore[attr-defined]
    who.add_argument("-n", "--namespace", default="", help="the namespace to ask in")
    who.add_argument("--name", default="", help="an object name (for resourceNames rules)")
    _labels_flag(who)
    _output(who, ("table", "json", "yaml"), "table")

    audit = sub.add_parser(
        "audit",
        parents=[policy, rbac_source],
        help="existing objects left to admins, labels in no bucket, buckets and their holders",
    )
    audit.add_argument("-n", "--namespace", default="", help="only this namespace")
    _output(audit, ("table", "json", "yaml"), "table")

    certs = sub.add_parser("gen-certs", help="write a CA and serving certificate")
    certs.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="write ca.crt, tls.crt, tls.key here"
    )
    certs.add_argument(
        "--dns", action="append", required=True, metavar="NAME", help="a DNS name of the server"
    )
    certs.add_argument(
        "--days", type=_days_arg, default=365, metavar="N", help="validity in days (at least 1)"
    )

    test = sub.add_parser(
        "test",
        parents=[policy],
        help="run policy test suites (label-rbac-test.yaml: RBAC and cases with expected "
        "verdicts), offline, for CI",
    )
    test.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="a suite file, or a directory searched for label-rbac-test.yaml files",
    )
    _output(test, ("table", "json", "junit"), "table")

    completion = sub.add_parser(
        "completion", help="print a shell completion script (source it in your shell's profile)"
    )
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")

    lint = sub.add_parser("lint", parents=[policy], help="validate permission annotations")
    lint.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="Role and ClusterRole manifests"
    )
    _output(lint, ("text", "json"), "text")
    return parser


def _output(parser: argparse.ArgumentParser, formats: tuple[str, ...], default: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=formats,
        default=default,
        help=f"output format (default {default})",
    )


def _labels_flag(parser: argparse.ArgumentParser) -> None:
    """``-l``: the labels of the objects asked about, in ``check`` and ``who-can`` alike."""
    parser.add_argument(
        "-l",
        "--label",
        action="extend",
        default=[],
        type=_labels_arg,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="the labels of the objects asked about, as kubectl -l spells equality (repeatable); "
        "for list, watch and deletecollection, the label selector",
    )


def _log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="info",
        metavar="LEVEL",
        help="the least severe log record written: debug, info, warning or error (default info)",
    )


_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # resource
    r"(\.[a-z0-9]([-.a-z0-9]*[a-z0-9])?)?"  # .group
    r"(/[a-z0-9]+)?"  # /subresource
)


def _resource_arg(text: str) -> Resource:
    """``res[.group][/subresource]`` as kubectl spells it; anything else is refused here."""
    if not _RESOURCE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid resource {text!r}: expected res[.group][/subresource], "
            "e.g. configmaps, deployments.apps, pods/exec"
        )
    return Resource.parse(text)


def _labels_arg(text: str) -> list[tuple[str, str]]:
    """``KEY=VALUE[,KEY=VALUE...]``: the equality terms of ``kubectl -l``."""
    found = []
    for term in text.split(","):
        key, sep, value = term.partition("=")
        if not sep or not is_label_key(key) or not is_label_value(value):
            raise argparse.ArgumentTypeError(
                f"invalid label {text!r}: expected KEY=VALUE (comma-separated for several), a "
                "label key and value as Kubernetes accepts them"
            )
        found.append((key, value))
    return found


_SUBRESOURCE = re.compile(r"[a-z0-9]+")


def _subresource_arg(text: str) -> str:
    if not _SUBRESOURCE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid subresource {text!r}: e.g. exec or status")
    return text


def _days_arg(text: str) -> int:
    if not _COUNT.fullmatch(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid --days {text!r}: expected a whole number >= 1")
    return int(text)


def _leader_flags(parser: argparse.ArgumentParser, lease_name: str) -> None:
    """The cluster and the Lease of a leader-elected controller (``compile``, ``report``)."""
    parser.add_argument(
        "--kubeconfig", type=Path, help="the cluster (default: $KUBECONFIG, or in-cluster)"
    )
    parser.add_argument(
        "--lease-namespace",
        default="label-rbac",
        metavar="NAMESPACE",
        help="the namespace of the Lease replicas elect a leader with (default label-rbac)",
    )
    parser.add_argument(
        "--lease-name", default=lease_name, metavar="NAME", help=f"its name (default {lease_name})"
    )
    parser.add_argument(
        "--lease-seconds",
        type=_seconds_arg,
        default=15.0,
        metavar="SECONDS",
        help="how long a replica's lease lasts unrenewed (default 15)",
    )
    parser.add_argument(
        "--identity", help="this replica's name in the Lease (default: host name and a number)"
    )


def _source_flags() -> _Parser:
    parent = _Parser(add_help=False)
    group = parent.add_argument_group("RBAC source (default: the cluster, as kubectl finds it)")
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--rbac-dir", type=Path, metavar="DIR", help="read RBAC (and, for audit, objects) here"
    )
    exclusive.add_argument(
        "--kubeconfig", type=Path, metavar="FILE", help="read RBAC from this cluster"
    )
    group.add_argument(
        "--context", metavar="NAME", help="the kubeconfig context to use (default: current)"
    )
    return parent


def _selector_arg(text: str) -> Selector:
    """``kubectl -l`` syntax: blanks around terms are skipped as Kubernetes skips them, and
    every key and value must then be one Kubernetes accepts."""
    try:
        selector = parse_selector(text)
    except SelectorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    for req in selector:
        bad = [v for v in req.values if not is_label_value(v)]
        if not is_label_key(req.key) or bad:
            raise argparse.ArgumentTypeError(
                f"invalid label selector {text!r}: {req.key!r}{f' {bad[0]!r}' if bad else ''} is "
                "not a label key and value as Kubernetes accepts them"
            )
    return selector


def _cmd_completion(args: argparse.Namespace) -> int:
    print(script(args.shell, _parser("label-rbac")), end="")
    return 0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments, with ``check``'s positional words taken wherever they stand among its
    flags, as kubectl takes them (``check create -n t1 configmaps``): argparse reads only the
    first run of positionals, and leaves the others over."""
    args, extras = parser.parse_known_args(argv)
    if args.command == "check" and extras and not any(e.startswith("-") for e in extras):
        args.request = [*args.request, *extras]
    elif extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None, prog: str = "python -m app") -> int:
    try:
        args = _parse(_parser(prog), argv)
    except UsageError as exc:
        print(one_line(str(exc)), file=sys.stderr)
        return 2
    handler = {
        "serve": cmd_serve,
        "compile": cmd_compile,
        "report": cmd_report,
        "check": cmd_check,
        "who-can": cmd_who_can,
        "audit": cmd_audit,
        "gen-certs": cmd_gen_certs,
        "lint": cmd_lint,
        "test": cmd_test,
        "completion": _cmd_completion,
    }[args.command]
    try:
        return handler(args)
    except (CliError, ManifestError) as exc:
        print(f"{args.command}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as kubectl does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> int:
    """The ``label-rbac`` console script."""
    return main(prog="label-rbac")


def plugin_main() -> int:
    """The ``kubectl-label_rbac`` console script: kubectl runs it for ``kubectl label-rbac``."""
    return main(prog="kubectl label-rbac")


def plugin_complete(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl_complete-label_rbac`` console script: kubectl runs it with the words after
    ``kubectl label-rbac`` (the last one being completed) when the shell asks it to complete
    them, and reads cobra's ``__complete`` answer (see ``completion.cobra``)."""
    words = list(sys.argv[1:] if argv is None else argv)
    print(cobra(_parser("kubectl label-rbac"), words), end="")
    return 0
