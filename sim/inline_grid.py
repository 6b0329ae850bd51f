"""An in-process Flower ``Grid``: no SuperLink, no Ray (the inline backend, and tests).

Messages are handed straight to a ClientApp (or any handler ``(msg, context) -> Message``);
a handler that raises becomes an error reply, as a real SuperNode would report it, except
``TimeoutError``, which stands for a node that never answers (timed out or disconnected):
its message simply gets no reply. Node ids are ``1000 + i`` for the i-th node config.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

Handler = Callable[[Message, Context], Message]


@contextmanager
def task_identity() -> Iterator[None]:
    """Let ``Message``s be built outside a running Flower app.

    Flower 1.4x reads the run and node ids of the current task from ``TaskIdentity`` (an
    internal API, touched only here); dummy ids stand in and are restored afterwards.
    """
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class InProcessGrid(Grid):
    """Nodes ``1..n`` with the given node configs, all served by ``handler``."""

    def __init__(
        self,
        handler: Handler,
        node_configs: list[dict[str, Any]],
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.handler = handler
        self.contexts = {
            1000 + i: Context(
                run_id=1,
                node_id=1000 + i,
                node_config=dict(cfg),
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i, cfg in enumerate(node_configs)
        }
        self.sent: list[list[int]] = []
        self._replies: dict[str, Message] = {}

    def set_run(self, run_id: int) -> None:  # type: ignore[override]
        """Nothing to set: the grid serves one run."""

    @property
    def run(self) -> Any:
        return None

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for i, msg in enumerate(messages):
            node = msg.metadata.dst_node_id
            try:
                reply = self.handler(msg, self.contexts[node])
            except TimeoutError:
                continue
            except Exception as err:  # a crashing client becomes an error reply
                reply = Message(Error(code=1, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
            key = f"{len(self._replies)}-{i}"
            self._replies[key] = reply
            ids.append(key)
        self.sent.append([self._replies[k].metadata.src_node_id for k in ids])
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(k) for k in message_ids]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
