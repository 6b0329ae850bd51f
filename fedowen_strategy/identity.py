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
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


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
