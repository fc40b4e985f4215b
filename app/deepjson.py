"""JSON nested as deeply as the API server allows: parsed, and walked afterwards, without a crash.

kube-apiserver decodes objects nested up to 10,000 levels (apimachinery's JSON depth limit), and
custom resources with ``x-kubernetes-preserve-unknown-fields`` reach the webhook that deep.
CPython's default recursion limit (1,000) makes ``json.loads`` raise ``RecursionError`` long
before that, and so would every later recursive walk of the object (``copy.deepcopy``,
``json.dumps``, ``==``, ``repr``, a recursive walker in a rule).

Two ways out were measured (CPython 3.11, x86-64):

- an iterative pure-Python parser: 5x (string-heavy) to over 30x (token-heavy) slower than the C
  parser on a 3 MiB review, and it only fixes the parse: every later walk still recurses;
- a higher recursion limit on threads whose C stack can hold it. The C parser stays. Pure-Python
  recursion costs no C stack in 3.11; the C-recursive paths cost at most 210 bytes per level
  (an 8 MiB stack held 64,900 levels of ``json.loads``, 74,200 of ``json.dumps``, 43,000 of
  ``==`` and 40,000 of ``repr``).

The second is used. ``RECURSION_LIMIT`` leaves room for two frames per level (the rhythm of
``copy.deepcopy``) for an object at the API server's limit inside the review envelope, plus the
server's own call stack. ``THREAD_STACK_BYTES`` holds ``RECURSION_LIMIT`` levels of the costliest
C recursion six times over, so a document deeper than anything the API server sends ends in
``RecursionError`` (reported as ``TooDeep``, a ``ValueError``), never in a segfault. Threads
that exist before ``prepare()`` keep the platform's stack (8 MiB on glibc), which still holds
``RECURSION_LIMIT`` levels of the C parser.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

# apimachinery's limit on the nesting of a decoded object.
API_SERVER_MAX_DEPTH = 10_000
# The object sits three levels down in an AdmissionReview (review → request → object).
REVIEW_MAX_DEPTH = API_SERVER_MAX_DEPTH + 3
# Two frames per level, plus a few thousand for the server's own stack (gunicorn, Flask, rules).
RECURSION_LIMIT = 2 * REVIEW_MAX_DEPTH + 5_000
# At most 210 bytes of C stack per level on the costliest path (repr): 5 MiB; six times that.
THREAD_STACK_BYTES = 32 * 1024 * 1024


class TooDeep(ValueError):
    """The document is nested deeper than this process can parse."""


def prepare() -> None:
    """Raise the recursion limit and the stack of threads started from now on (never lowers).

    Process-wide on purpose: the request threads of the HTTP server are started after the app
    is created, and they are where reviews are parsed and decided.
    """
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
    if threading.stack_size() < THREAD_STACK_BYTES:
        threading.stack_size(THREAD_STACK_BYTES)


def loads(data: bytes | str) -> Any:
    """``json.loads``, with nesting beyond the recursion limit reported as ``TooDeep``.

    Bytes are decoded as JSON text (UTF-8, or UTF-16/32 by their byte order); invalid text raises
    ``UnicodeDecodeError``, a ``ValueError`` too.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise TooDeep(
            f"JSON nested deeper than {sys.getrecursionlimit():,} levels cannot be parsed"
        ) from None
