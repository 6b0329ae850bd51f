"""Client identities bound to nodes: a node cannot take another's id nor switch its own.

A client names itself (``client-id`` in its replies). The first node that names a client id
is bound to it; from then on

- a reply whose claimed id differs from its node's bound id is refused (a node cannot switch
  ids to shed a bad record),
- a node claiming an id bound to another *connected* node is refused and never costs that node
  its own reply (the refusal names the claiming node, not the victim),
- an id whose node has left (not among the connected nodes) can be bound again: a restarted
  simulation or an unauthenticated SuperNode gets a new node id. With SuperNode
  authentication a node's id follows its registered key, so ids stay bound to keys.

The book is part of the strategy's checkpoint, so bindings survive a resume.

:class:`Roster` is the strategy's side of it: it asks new nodes for their client ids (one
``query`` message each), refuses impostors' replies, orders the selectable nodes by client id
and names the selected nodes that sent no reply. :class:`Identity` is the ``identity`` step of the
defence list: it refuses impostors' replies by the run's book (FedOwen's roster, or the one
:class:`~fedowen_strategy.defences.defended.Defended` keeps around a Flower strategy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from flwr.app import Message, RecordDict

from fedowen_strategy.defences.base import Gate, Guard
from fedowen_strategy.nodes import client_order
from fedowen_strategy.replies import ParsedReplies, client_id_of

log = logging.getLogger(__name__)
#: What a Flower ClientApp answers to a message type it registered no function for.
NO_QUERY_HANDLER = "No query function registered"
#: ``targets -> replies``: sends the identity query to the target nodes.
Ask = Callable[[list[int]], Iterable[Message]]
#: ``replies -> (kept, refused)``: the refuse steps of a round.
Refuse = Callable[[list[Message]], tuple[list[Message], dict[str, str]]]


@dataclass
class IdentityBook:
    """``client_of_node``: node id -> bound client id."""

    client_of_node: dict[int, str] = field(default_factory=dict)

    def node_of(self, client_id: str) -> int | None:
        """The node bound to ``client_id``, if any."""
        return next((n for n, c in self.client_of_node.items() if c == client_id), None)

    def claim(self, node: int, client_id: str, connected: Collection[int]) -> str | None:
        """Bind ``node`` to ``client_id`` or check its binding; the refusal reason, or None.

        Parameters
        ----------
        node : int
            The node the claim comes from (a message's source node id).
        client_id : str
            The id it claims.
        connected : collection of int
            Nodes connected now: an id bound to a node not among them may be re-bound.
        """
        bound = self.client_of_node.get(node)
        if bound is not None:
            if bound == client_id:
                return None
            return (f"node {node} is bound to client {bound!r} but claimed {client_id!r}: a "
                    "node cannot switch ids")
        owner = self.node_of(client_id)
        if owner is not None and owner in connected:
            return (f"node {node} claimed client id {client_id!r}, which is bound to "
                    f"connected node {owner}")
        if owner is not None:
            log.info("client %s re-bound from node %d (gone) to node %d", client_id, owner, node)
            del self.client_of_node[owner]
        self.client_of_node[node] = client_id
        return None


@dataclass
class Roster:
    """The strategy's view of who is who: the identity book, the nodes refused (they claimed
    another connected node's id) and whether ClientApps answer the identity query at all."""

    book: IdentityBook = field(default_factory=IdentityBook)
    refused: set[int] = field(default_factory=set)
    unanswered: bool = False

    def identify(self, ask: Ask, nodes: list[int]) -> None:
        """Ask nodes not heard from yet for their client ids.

        While nobody has been named, one node is asked first: a ClientApp without a query
        handler (Flower's quickstart registers only train and evaluate) answers with an error,
        which is logged once, and no node is asked again. Client ids then come from the train
        replies where a ClientApp sends one, else nodes are labelled by node id.
        """
        unknown = [node for node in nodes if node not in self.book.client_of_node]
        if not unknown or self.unanswered:
            return
        if not self.book.client_of_node:  # probe one node before asking everyone
            first = self._query(ask, unknown[:1], nodes)
            if self.unanswered:
                return
            named = first + self._query(ask, unknown[1:], nodes)
        else:
            named = self._query(ask, unknown, nodes)
        log.info("Identified %d of %d new nodes by client id", named, len(unknown))

    def _query(self, ask: Ask, targets: list[int], nodes: list[int]) -> int:
        """Ask ``targets``; how many named themselves."""
        if not targets:
            return 0
        named = 0
        for reply in ask(targets):
            if reply.has_error():
                reason = (reply.error.reason or "").strip()
                if NO_QUERY_HANDLER in reason and not self.unanswered:
                    self.unanswered = True
                    log.info("The ClientApp answers no query (%s): clients are labelled "
                             "by the client id their train replies carry, else by node id; no "
                             "node is asked again", reason.splitlines()[-1][:120])
                continue
            node = reply.metadata.src_node_id
            refused = self.book.claim(node, client_id_of(reply), nodes)
            if refused:
                log.warning("identity refused: %s; node %d is not selected", refused,
                            node)
                self.refused.add(node)
            else:
                named += 1
        return named

    def selectable(self, nodes: list[int], banned: Collection[str], server_round: int = 0
                   ) -> tuple[list[int], list[str]]:
        """Selectable nodes and their client ids, ordered by client id (numbers numerically);
        refused nodes and banned client ids are left out (with an error when none is left)."""
        keyed = [(self.book.client_of_node.get(node, f"node:{node}"), node) for node in nodes
                 if node not in self.refused]
        keyed = [(key, node) for key, node in keyed if key not in banned]
        keyed.sort(key=lambda kn: client_order(kn[0]))
        if not keyed:
            log.error("round %d: none of the %d connected nodes may be selected (%d "
                      "refused ids, %d client ids linked as copies of each other): the round "
                      "trains nobody and keeps the global model. Clients that share data and seed "
                      "return copies; give them distinct data, or set duplicate-tolerance = 0",
                      server_round, len(nodes), len(self.refused), len(banned))
        return [n for _, n in keyed], [k for k, _ in keyed]

    def check(self, replies: Iterable[Message], connected: Collection[int]
              ) -> tuple[list[Message], dict[str, str]]:
        """Replies whose claimed id matches their node's binding, and the refused ones
        (keyed ``node:<id>`` by the claiming node, so the victim is not blamed)."""
        kept, refused = [], {}
        for msg in replies:
            node = msg.metadata.src_node_id
            reason = None if msg.has_error() else self.book.claim(
                node, client_id_of(msg), connected)
            if reason:
                refused[f"node:{node}"] = reason
                log.warning("rejected a reply: %s", reason)
            else:
                kept.append(msg)
        return kept, refused

    def intake(self, replies: list[Message], selected: Iterable[int],
               connected: Collection[int], parse: Callable[[list[Message]], ParsedReplies],
               refuse: Refuse | None = None) -> tuple[ParsedReplies, dict[int, RecordDict]]:
        """A round's replies, parsed by ``parse`` once ``refuse`` (the defence list's refuse
        steps; default: this book's :meth:`check`) has refused impostors, with the selected
        nodes that sent nothing counted as failed; and the accepted replies' contents by node."""
        silent = self.silent(replies, selected)
        kept, impostors = (refuse or (lambda r: self.check(r, connected)))(replies)
        parsed = parse(kept)
        parsed.rejected.update(impostors)
        parsed.failed.update(silent)
        return parsed, {r.metadata.src_node_id: r.content for r in kept if not r.has_error()}

    def silent(self, replies: Iterable[Message], selected: Iterable[int]) -> dict[str, str]:
        """Selected nodes that sent no reply (timed out, disconnected): counted as failed."""
        replied = {msg.metadata.src_node_id for msg in replies}
        silent = {}
        for node in selected:
            if node not in replied:
                who = self.book.client_of_node.get(node, f"node:{node}")
                silent[who] = "no reply within round-timeout (timed out or disconnected)"
                log.warning("client %s (node %d) sent no reply this round", who, node)
        return silent


class Identity(Guard):
    """``identity``: a reply whose claimed client id is not its node's (or is another connected
    node's) is refused, keyed ``node:<id>`` (:meth:`Roster.check`); nothing to do where the
    strategy keeps no book."""

    name = "identity"

    def refuse(self, replies: list[Message], gate: Gate) -> tuple[list[Message], dict[str, str]]:
        if gate.book is None:
            return replies, {}
        return gate.book.check(replies, gate.connected)
