"""A run that learns nothing says so: the stall rule over round records, and its watcher.

Without it a run whose every reply is rejected (the clients' model does not match the
server's, say) logs "no usable update; global model kept" for a hundred rounds and ends
"completed". :func:`stall_reason` is the rule, a pure function of the training rounds' records
(``rounds.jsonl``'s ``returned``, ``failed`` and ``rejected``); :class:`StallWatch` applies it
after each round's record and checkpoint are written and raises :class:`RunStalled`, which
fails the run (``flwr run``'s status ``finished:failed``; the CLI exits 1).

The rule, with ``n = max-stalled-rounds`` (0: never stop):

- a round that accepted no update and whose replies, at least 2 of them, were all rejected
  (or all failed) for one and the same reason stops the run at once: a reason every client
  gives alike will not go away by itself;
- otherwise ``n`` rounds in a row without an accepted update stop it, whatever the reasons.

A round that accepted any update is not stalled (some clients timing out is a normal round).
Selected nodes that sent no reply, or that the SuperLink reports unavailable
(:func:`unreached`), are not replies: a network outage passes, so they count toward ``n``
only. A single reply is not "every reply" (one client's mistake is not the federation's):
a round with one reply stops the run only through ``n``. The watcher sees the rounds of this
invocation: a resumed run counts afresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from fedowen_task.protocol import NUM_EXAMPLES_FIELD

#: Failure reasons that say a node or its message was not there, not what the node did:
#: FedOwen's and :class:`server_app.strategies.Recorded`'s "no reply ..." and the SuperLink's
#: "Node Unavailable", "Message Unavailable", "Reply Message Unavailable".
UNREACHED = ("no reply", "Unavailable")
#: The fewest replies of one round that can stop it at once.
MIN_ALIKE = 2
#: What to check, by a fragment of the reason: the first that matches.
ADVICE = (
    (("NaN or Inf",), "local training diverged: lower `lr` (or check the clients' data)"),
    (("array keys differ", ", expected ", "size mismatch", "Error(s) in loading state_dict",
      "Missing key(s)", "Unexpected key(s)", "shapes cannot be multiplied"),
     "the clients' model does not match the server's: check that `model` and `dataset` "
     "(its classes and channels shape the model) are the same at every node as at the "
     "ServerApp, and that every SuperNode runs this version of the app"),
    (("exceeds",), "the updates are larger than the guards allow: check `lr` and "
                   "`local-epochs`, or the guard named in the reason (`max-norm-ratio`, "
                   "`update-bound`)"),
    ((NUM_EXAMPLES_FIELD, "no ArrayRecord", "malformed"),  # a reason names the field
     "the ClientApp's reply is not what the server expects: check that every SuperNode runs "
     "this version of the app"),
)
FAILED_ADVICE = "the ClientApp raised on every node: see the error above and the clients' logs"
DEFAULT_ADVICE = "see the round's `failed` and `rejected` entries in rounds.jsonl"


class RunStalled(RuntimeError):
    """The run stopped because it accepted no update (:func:`stall_reason`)."""


def unreached(reason: str) -> bool:
    """Whether a failure says the node or its message was not there (:data:`UNREACHED`)."""
    return any(fragment in reason for fragment in UNREACHED)


def advice(reason: str, failed: bool = False) -> str:
    """What to check for ``reason`` (:data:`ADVICE`)."""
    for fragments, text in ADVICE:
        if any(fragment in reason for fragment in fragments):
            return text
    return FAILED_ADVICE if failed else DEFAULT_ADVICE


def accepted(record: Mapping[str, Any]) -> bool:
    """Whether the round accepted any update (its ``returned`` clients)."""
    return bool(record.get("returned"))


def alike(record: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """``(verb, reason, count)`` when the round accepted nothing and its replies, at least
    :data:`MIN_ALIKE` of them, were all rejected (verb ``"was rejected"``) or all failed
    (``"failed"``) for one reason; else None. Unreached nodes (:func:`unreached`) are left out."""
    if accepted(record):
        return None
    replies = [("was rejected", str(r)) for r in (record.get("rejected") or {}).values()]
    replies += [("failed", str(r)) for r in (record.get("failed") or {}).values()
                if not unreached(str(r))]
    if len(replies) < MIN_ALIKE or len(set(replies)) != 1:
        return None
    verb, reason = replies[0]
    return verb, reason, len(replies)


def stalled_run(rounds: Sequence[Mapping[str, Any]]) -> int:
    """How many of the last rounds in a row accepted no update."""
    count = 0
    for record in reversed(rounds):
        if accepted(record):
            break
        count += 1
    return count


def round_outline(record: Mapping[str, Any]) -> str:
    """``3 failed (no reply ...), 7 rejected (array 'x' ..., and 2 other reasons)``."""
    parts = []
    for key in ("failed", "rejected"):
        reasons = Counter(str(r) for r in (record.get(key) or {}).values())
        if reasons:
            top, _ = reasons.most_common(1)[0]
            more = f", and {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else ""
            parts.append(f"{sum(reasons.values())} {key} ({top}{more})")
    return ", ".join(parts) or f"no replies from {len(record.get('selected') or [])} selected"


def stall_reason(rounds: Sequence[Mapping[str, Any]], max_stalled: int) -> str | None:
    """Why the run must stop after the last of ``rounds`` (training rounds' records, in
    order), or None to go on. ``max_stalled`` is ``max-stalled-rounds`` (0: never stop)."""
    if max_stalled <= 0 or not rounds:
        return None
    last = rounds[-1]
    number = last.get("round", len(rounds))
    same = alike(last)
    if same is not None:
        verb, reason, count = same
        return (f"every reply of round {number} {verb} ({count} replies, one reason): {reason}; "
                f"{advice(reason, failed=verb == 'failed')}")
    stalled = stalled_run(rounds)
    if stalled < max_stalled:
        return None
    first = rounds[-stalled].get("round", len(rounds) - stalled + 1)
    reasons = Counter(str(r) for key in ("rejected", "failed")
                      for r in (last.get(key) or {}).values() if not unreached(str(r)))
    top = advice(reasons.most_common(1)[0][0]) if reasons else DEFAULT_ADVICE
    return (f"no update was accepted in {stalled} rounds in a row (rounds {first}-{number}, "
            f"max-stalled-rounds = {max_stalled}); round {number}: {round_outline(last)}; "
            f"{top}" + ("" if top == DEFAULT_ADVICE else f"; {DEFAULT_ADVICE}"))


class StallWatch:
    """Applies :func:`stall_reason` to each training round's record as it is written.

    Parameters
    ----------
    max_stalled : int
        ``max-stalled-rounds`` (0: never stop).
    where : str
        Where the run's records are, for the error.
    """

    def __init__(self, max_stalled: int, where: str = "") -> None:
        self.max_stalled, self.where = max_stalled, where
        self.rounds: list[Mapping[str, Any]] = []

    def observe(self, record: Mapping[str, Any]) -> None:
        """Keep ``record`` (a training round's, the initial evaluation's is ignored) and
        raise :class:`RunStalled` when the rule says stop."""
        if "selected" not in record or self.max_stalled <= 0:
            return
        self.rounds = [*self.rounds[-(self.max_stalled - 1):], record] \
            if self.max_stalled > 1 else [record]
        reason = stall_reason(self.rounds, self.max_stalled)
        if reason is not None:
            kept = f" Records up to this round are in {self.where}." if self.where else ""
            raise RunStalled(f"The run stopped: {reason}.{kept} (max-stalled-rounds = 0 never "
                             "stops.)")
