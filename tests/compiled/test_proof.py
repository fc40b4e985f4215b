"""The proof that the policies see a batch of new parameters (``app.compiled.proof``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from app.compiled.admission_policy import EPOCH, EPOCH_MESSAGE, SHIPPED, Install
from app.compiled.proof import (
    GIVE_UP,
    NOT_SEEN,
    SEEN_RETRIES,
    EpochUnchecked,
    Unseen,
    prove,
    retried,
)
from app.source.api import ApiError

RENAMED = Install("acme", "acme-system")
PATH = "/apis/labelrbac.io/v1alpha1/namespaces/t1/labelrbacparams/label-rbac"


class Api:
    """The sentinel's parameters as the API server admits writes of them: an update refused
    ``unseen`` times (its informer does not hold them yet), an epoch asked for seen after
    ``lag`` refusals, and never-set epochs refused unless the policy does not check them."""

    def __init__(self, unseen: int = 0, lag: int = 0, checks: bool = True) -> None:
        self.unseen, self.lag, self.checks = unseen, lag, checks
        self.epoch = ""
        self.sent: list[str] = []

    def send(self, method: str, path: str, body: Mapping[str, Any], query: Any, *_: Any) -> Any:
        assert (method, path) == ("PATCH", PATH)
        if ("dryRun", "All") not in query:
            self.sent.append("set")
            if self.unseen:
                self.unseen -= 1
                raise ApiError(422, "Invalid", f"denied request: {NOT_SEEN}")
            self.epoch = body["metadata"]["annotations"][EPOCH]
            return body
        asked = body["metadata"]["labels"][EPOCH]
        self.sent.append("ask" if asked == self.epoch else "ask-never")
        if asked == self.epoch and self.lag:
            self.lag -= 1
        elif asked == self.epoch or not self.checks:
            return body
        raise ApiError(403, "Forbidden", f"denied request: {EPOCH_MESSAGE}")


def epochs() -> Any:
    counter = itertools.count()
    return lambda: f"e-{next(counter)}"


@pytest.mark.parametrize(
    ("api", "sent"),
    [
        pytest.param(Api(), ["set", "ask-never", "ask", "set", "ask"], id="seen-at-once"),
        pytest.param(
            Api(unseen=1, lag=2),
            ["set", "set", "ask-never", "ask", "ask", "ask", "set", "ask"],
            id="sentinel-and-epoch-late",
        ),
    ],
)
def test_a_proof_sets_two_epochs_and_waits_for_each(api: Api, sent: list[str]) -> None:
    prove(api, PATH, epochs())  # type: ignore[arg-type]
    assert api.sent == sent


@pytest.mark.parametrize(
    ("api", "error"),
    [
        pytest.param(Api(checks=False), EpochUnchecked, id="policy-without-epochs"),
        pytest.param(Api(lag=len(SEEN_RETRIES) + 1), ApiError, id="never-seen"),
        pytest.param(Api(unseen=len(SEEN_RETRIES) + 1), ApiError, id="sentinel-never-seen"),
    ],
)
def test_a_proof_fails_where_it_proves_nothing(api: Api, error: type[Exception]) -> None:
    with pytest.raises(error):
        prove(api, PATH, epochs())  # type: ignore[arg-type]


REFUSED = ApiError(422, "Invalid", f"denied request: {NOT_SEEN}")
OTHER = ApiError(403, "Forbidden", "denied request: something else")
NOT_YET = ApiError(503, "NotInForce", "not yet")
TRIES = len(SEEN_RETRIES) + 1


@pytest.mark.parametrize(
    ("outcomes", "failure", "raised"),
    [
        pytest.param([REFUSED, REFUSED, True], None, None, id="refused-then-done"),
        pytest.param([False, REFUSED, True], NOT_YET, None, id="not-yet-then-done"),
        pytest.param([REFUSED] * TRIES, None, (503, "NotSeen"), id="refused-to-the-end"),
        pytest.param([False] * TRIES, NOT_YET, (503, "NotInForce"), id="not-yet-to-the-end"),
        pytest.param([REFUSED, OTHER], NOT_YET, (403, "Forbidden"), id="another-refusal-at-once"),
    ],
)
def test_an_attempt_is_tried_again_while_refused_as_unseen_or_not_done(
    outcomes: list[bool | ApiError], failure: ApiError | None, raised: tuple[int, str] | None
) -> None:
    """Tried ``len(SEEN_RETRIES) + 1`` times at most; then a retryable error (503), or the one
    given; any other refusal at once."""
    left = iter(outcomes)

    def attempt() -> bool:
        outcome = next(left)
        if isinstance(outcome, ApiError):
            raise outcome
        return outcome

    if raised is None:
        retried(attempt, (NOT_SEEN,), PATH, failure)
    else:
        with pytest.raises(ApiError) as caught:
            retried(attempt, (NOT_SEEN,), PATH, failure)
        assert (caught.value.status, caught.value.reason) == raised
    assert next(left, None) is None  # every outcome used, none more


def test_a_batch_is_what_waited_when_it_was_taken_and_still_waits_unchanged() -> None:
    unseen = Unseen()
    first, second = object(), object()
    unseen.add("a", first)
    unseen.add("b", first)
    assert unseen.take({"a"}) == ("b", {"a": first, "b": first})
    assert unseen.take(set()) is None  # one proof at a time
    unseen.add("a", second)  # written again meanwhile: not proven by this batch
    unseen.add("c", second)  # created after the batch was taken
    assert unseen.proven({"a": first, "b": first}) == ["b"]
    assert len(unseen) == 2 and unseen.proving == ""
    # Written again outside a batch (proven on its own, or left to the webhook): not proven by
    # the batch taken before.
    assert unseen.take(set()) == ("a", {"a": second, "c": second})
    unseen.discard("c")
    assert unseen.proven({"a": second, "c": second}) == ["a"]
    assert len(unseen) == 0


@pytest.mark.parametrize(
    ("install", "waiting", "first"),
    [
        pytest.param(SHIPPED, ["label-rbac", "kube-system", "t1"], "t1", id="shipped"),
        pytest.param(RENAMED, ["acme-system", "kube-system", "t1"], "t1", id="renamed"),
        # Another install's namespace is judged like any.
        pytest.param(
            RENAMED, ["acme-system", "label-rbac"], "label-rbac", id="renamed-judges-shipped"
        ),
    ],
)
def test_a_namespace_the_policies_never_judge_is_a_sentinel_only_when_nothing_else_waits(
    install: Install, waiting: list[str], first: str
) -> None:
    """Kube-system and the install's own namespace: a dry run there is refused by no policy,
    so the sentinel is taken among the others while one is free."""
    unseen = Unseen(install.unjudged)
    for name in waiting:
        unseen.add(name, None)
    batch = dict.fromkeys(waiting)
    assert unseen.take(set()) == (first, batch)
    unseen.failed(unchecked=False)
    # Only unjudged ones free: one of them, whose proof fails over to one at a time.
    assert unseen.take({first}) == (waiting[0], batch)


def test_sentinels_that_do_not_check_epochs_are_handed_back_then_batches_given_up() -> None:
    unseen = Unseen()
    names = [f"n{i:02d}" for i in range(GIVE_UP + 2)]
    for name in names:
        unseen.add(name, None)
    handed = []
    for _ in range(GIVE_UP):
        assert unseen.batches
        assert unseen.take(set()) is not None
        handed.append(unseen.failed(unchecked=True))
    assert handed[: GIVE_UP - 1] == [[n] for n in names[: GIVE_UP - 1]]
    assert sorted(handed[-1]) == names[GIVE_UP - 1 :]
    assert not unseen.batches and len(unseen) == 0
    unseen.reset()
    assert unseen.batches
