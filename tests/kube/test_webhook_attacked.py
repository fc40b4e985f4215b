"""Honest writes through the real kube-apiserver while a pod attacks the webhook's port.

The installed state (manifests/enforce: failurePolicy Fail) and the webhook as the real server
process in its shipped model (2 workers x 4 threads). From other loopback addresses, as a pod
reaching the webhook's Service would: malformed chunk sizes (``-6``, several per worker, again
and again), Transfer-Encoding lists with a body trickled after them, and hundreds of idle
connections. A tenant's own-bucket writes meanwhile must all be allowed, about as fast as
without the attack, and the webhook's workers must be the ones that started.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.support import install_tenants, obj
from tests.webhook.test_connections import idle_tcp, tls
from tests.webhook.test_framing import HEAD, workers

ATTACKERS = tuple(f"127.0.2.{i}" for i in range(1, 11))
TE_LISTS = (b"gzip, chunked", b"identity, chunked")


class Attack:
    """Keeps sending malformed framing and holding connections until stopped."""

    def __init__(self, kube: LabelRbacCluster) -> None:
        assert kube.webhook is not None
        self.server = kube.webhook
        self.stopping = threading.Event()
        self.sent = 0
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        turn = 0
        while not self.stopping.is_set():
            source = ATTACKERS[turn % len(ATTACKERS)]
            with contextlib.suppress(OSError):
                for _ in range(4):  # twice per worker
                    sock = tls(self.server, source)
                    sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n-6\r\nabcdef\r\n")
                    self.held.append(sock)
                for coding in TE_LISTS * 6:
                    sock = tls(self.server, source)
                    sock.sendall(HEAD + b"Transfer-Encoding: " + coding + b"\r\n\r\n5")
                    self.held.append(sock)
                for _ in range(60):
                    self.held.append(idle_tcp(self.server, source))
                self.sent += 1
            turn += 1
            self.stopping.wait(1.0)

    def __enter__(self) -> Attack:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        for sock in self.held:
            sock.close()


def timed_write(kube: LabelRbacCluster, namespace: str, name: str) -> float:
    document = obj("ConfigMap", name, namespace, {"team": "a"})
    started = time.monotonic()
    done = kube.kubectl("alice", "create", "-f", "-", input=yaml.safe_dump(document), timeout=30)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    return took


def test_honest_writes_are_allowed_promptly_while_the_webhook_is_attacked(
    kube: LabelRbacCluster, namespace: str
) -> None:
    install_tenants(kube, namespace)
    assert kube.webhook is not None
    before = workers(kube.webhook)
    quiet = [timed_write(kube, namespace, f"quiet-{i}") for i in range(6)]
    with Attack(kube) as attack:
        time.sleep(1.0)
        attacked = []
        for i in range(16):
            attacked.append(timed_write(kube, namespace, f"attacked-{i}"))
            time.sleep(0.5)
        rounds = attack.sent
    assert rounds >= 5, rounds  # the attack went on throughout
    # kubectl's own start is most of each figure; the webhook's share must not grow by seconds.
    assert max(attacked) < max(quiet) + 2.0, (sorted(quiet), sorted(attacked))
    assert workers(kube.webhook) == before
