"""Load for the HTTP benchmarks: the review mix, and wrk or Python threads sending it.

The mix is 64 AdmissionReviews (tenants of the generated layout creating ConfigMaps in their own
namespaces, every other one with a label in nobody's bucket: denied) for ``POST /validate`` and
64 SubjectAccessReviews (label-scoped lists, every other one without a selector: denied) for
``POST /authorize``. wrk cycles through them from a Lua script; where wrk is not installed,
Python threads do the same on keep-alive connections (slower: compare ratios only).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.layout import layout
from bench.core.servers import Running
from bench.core.stats import percentile
from tests.support import make_access_review, make_review

REVIEWS = 64


def review_mix(objects: int) -> dict[str, list[dict[str, Any]]]:
    """64 AdmissionReviews and 64 SubjectAccessReviews from tenants of the generated layout,
    every other one denied."""
    namespaces, _ = layout(objects)
    admission, access = [], []
    for i in range(REVIEWS):
        tenant = (i * 7919) % namespaces
        # Users 1 and 2 hold only their namespace's shared role (team a or b); user 0 is also
        # bound to a wildcard ClusterRole, which would allow every label.
        ns, user = f"tenant-{tenant}", f"user-{tenant}-{1 + i % 2}"
        team = "a" if i % 2 == 0 else "z"  # team=z is in nobody's bucket
        admission.append(make_review(user, "CREATE", "configmaps", namespace=ns,
                                     name=f"cm-{i}", labels={"team": team}))  # fmt: skip
        selector = [("team", "In", ["a"])] if i % 2 == 0 else None
        access.append(make_access_review(user, "list", "configmaps", namespace=ns,
                                         selector=selector))  # fmt: skip
    return {"/validate": admission, "/authorize": access}


def verdicts(running: Running, ca: Path, path: str, bodies: list[dict[str, Any]]) -> list[bool]:
    """Each review sent once: whether it was allowed (to check the mix is what it claims)."""
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    found = []
    for body in bodies:
        request = urllib.request.Request(running.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            answer = json.loads(response.read())
        found.append(bool((answer.get("response") or answer.get("status") or {})["allowed"]))
    return found


def lua_script(path: Path, bodies: list[dict[str, Any]]) -> None:
    """A wrk script cycling through ``bodies``, each connection from its own offset."""
    items = ",\n".join(json.dumps(json.dumps(b)) for b in bodies)
    path.write_text(
        f"local bodies = {{\n{items}\n}}\n"
        "local i = 0\n"
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        "init = function(args) i = math.random(#bodies) end\n"
        "request = function()\n"
        "  i = i % #bodies + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[i])\n"
        "end\n"
    )


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def wrk(url: str, script: Path, seconds: float, connections: int) -> dict[str, float]:
    threads = min(2, connections)  # wrk needs a connection per thread
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency",
         "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()

    def field(prefix: str) -> str:
        return next(ln for ln in lines if ln.strip().startswith(prefix)).split()[1]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sockets = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(field("Requests/sec")),
        "p50_ms": _ms(field("50%")),
        "p99_ms": _ms(field("99%")),
        "non_2xx": float(errors[1]) if errors else 0.0,
        "socket_errors": float(sum(map(int, re.findall(r"\d+", sockets[1])))) if sockets else 0.0,
    }


def python_load(
    url: str, ca: Path, bodies: list[bytes], seconds: float, connections: int
) -> dict[str, float]:
    """What ``wrk`` measures, from Python threads (where wrk is not installed, e.g. in CI):
    ``connections`` keep-alive connections, each posting the bodies in turn for ``seconds``."""
    import http.client
    import ssl
    import threading
    from urllib.parse import urlsplit

    context = ssl.create_default_context(cafile=str(ca))
    parts = urlsplit(url)
    latencies: list[float] = []
    errors = [0]
    deadline = time.monotonic() + seconds

    def client(offset: int) -> None:
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context)
        i = offset
        while (started := time.monotonic()) < deadline:
            conn.request("POST", parts.path, bodies[i % len(bodies)],
                         {"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            response.read()
            latencies.append(time.monotonic() - started)
            errors[0] += response.status != 200
            i += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"rps": len(latencies) / seconds, "p50_ms": 1e3 * percentile(latencies, 0.5),
            "p99_ms": 1e3 * percentile(latencies, 0.99), "non_2xx": float(errors[0]),
            "socket_errors": 0.0}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What every comparison runs: the reviews per path, how they are sent, for how long."""

    mix: dict[str, list[dict[str, Any]]]
    scripts: dict[str, Path]  # wrk's, per path
    ca: Path
    client: str
    connections: int
    seconds: float
    rounds: int
    log_level: str
    baseline: str  # the no-op: "flask" or "wsgi"


def load(running: Running, path: str, plan: Plan, seconds: float) -> dict[str, float]:
    if plan.client == "wrk":
        return wrk(running.url + path, plan.scripts[path], seconds, plan.connections)
    bodies = [json.dumps(b).encode() for b in plan.mix[path]]
    return python_load(running.url + path, plan.ca, bodies, seconds, plan.connections)
