"""Waiting for nodes, with a deadline and a message that says what to do.

Flower's ``sample_nodes`` waits for nodes forever; in a simulation whose federation has
fewer SuperNodes than a round needs (``flwr run .`` simulates 2 by default) that is a silent
hang. :func:`wait_for_nodes` gives up after ``timeout`` seconds and names the fix.
"""

from __future__ import annotations

import logging
import math
import time

from flwr.serverapp import Grid

log = logging.getLogger(__name__)

#: Seconds to wait for a round's k nodes (the app's ``node-wait-timeout``).
NODE_WAIT_TIMEOUT = 15.0
#: Seconds a round waits for its replies (the app's ``round-timeout``; FedOwen's identity
#: query waits as long).
ROUND_TIMEOUT = 600.0


def enough_nodes(need: int) -> int:
    """The one node-wait rule: a round asks for ``need`` nodes; after the timeout it goes on
    with at least half of them (``k`` is then capped to the nodes there are), and fails with
    fewer (Flower's default simulation has 2 nodes: a forgotten federation config)."""
    return max(1, math.ceil(need / 2))


def wait_for_nodes(grid: Grid, need: int, timeout: float, *, what: str = "") -> list[int]:
    """The connected node ids, sorted, once at least ``need`` are connected, or after
    ``timeout`` seconds when at least :func:`enough_nodes` are (with a warning).

    Raises
    ------
    RuntimeError
        After ``timeout`` seconds with fewer nodes, naming ``--federation-config
        "num-supernodes=..."`` (simulation), more SuperNodes (deployment) and ``what`` (the
        setting that asked for ``need`` nodes, e.g. ``clients-per-round=10``).
    """
    accept = enough_nodes(need)
    started = time.monotonic()
    next_log = started
    while len(nodes := sorted(grid.get_node_ids())) < need:
        waited = time.monotonic() - started
        if waited >= timeout and len(nodes) >= accept:
            log.warning("only %d node(s) connected after %.0fs, %d asked for%s: going on with "
                        "%d", len(nodes), waited, need, f" ({what})" if what else "", len(nodes))
            return nodes
        if waited >= timeout:
            raise RuntimeError(
                f"only {len(nodes)} node(s) connected after {waited:.0f}s, {need} needed"
                f"{f' ({what})' if what else ''}. In simulation run with --federation-config "
                f"\"num-supernodes={max(need, 100)}\" (any value >= {need}); in a deployment "
                "start more SuperNodes; or ask for fewer clients per round. "
                "node-wait-timeout sets how long to wait.")
        if time.monotonic() >= next_log:
            log.info("Waiting for nodes: %d connected, %d needed", len(nodes), need)
            next_log += 10.0
        time.sleep(0.5)
    return nodes


def client_order(client_id: str) -> tuple[int, int, str]:
    """Sort key: numeric ids by value, then other names, then unnamed ``node:<id>`` keys."""
    if client_id.isdigit():
        return (0, int(client_id), "")
    return (2 if client_id.startswith("node:") else 1, 0, client_id)
