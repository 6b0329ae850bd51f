"""FedOwen ClientApp: trains the global model on this client's partition.

A simulated client finds its partition from ``partition-id`` and ``num-partitions`` in its
node config and the dataset/split settings in the run config; a deployed SuperNode may also
set ``client-id`` (its stable name; default: the partition id) and ``data-dir`` (its local
data; default: the run config's ``data-dir``, else the rule of
:func:`fedowen_task.data.resolve_data_dir`) and ``device`` (where it trains; default: the run
config's ``device``, ``auto``: its GPU where it has one). The reply carries the trained weights,
``num-examples``, ``train-loss`` and the client id (in ConfigRecord ``client``, with the id of
the Ray node that ran the call when it ran in a Ray simulation), and what a selector asked for
in the train config (Oort's ``loss-squares``; DELTA's ``grad-variance`` with ``step-scale``;
``step-scale`` alone).

The ClientApp reads only its own run-config keys (:class:`fedowen_task.config.TaskConfig`)
and ignores the rest, and trains with FedProx's proximal term when the server's train config
carries ``proximal-mu`` (Flower's FedProx sends it).
"""

from __future__ import annotations

import logging
import sys
import zlib
from contextlib import nullcontext
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedowen_task.adversary.attacks import Attack, attack_of
from fedowen_task.adversary.client import ClientTurn, sybil_master
from fedowen_task.config import TaskConfig, parse_task_config
from fedowen_task.data import DatasetArrays, load_dataset, resolve_data_dir, to_tensor, white
from fedowen_task.device import device_problems, resolve
from fedowen_task.models import build_model
from fedowen_task.partition import federated_split
from fedowen_task.protocol import (
    CLIENT_ID_FIELD,
    CLIENT_RECORD_KEY,
    GRAD_VARIANCE_FIELD,
    LOCAL_LOSS_FIELD,
    LOSS_SQUARES_FIELD,
    NUM_EXAMPLES_FIELD,
    RAY_NODE_FIELD,
    STEP_SCALE_FIELD,
    UNIT_WEIGHT_FIELD,
)
from fedowen_task.training import evaluate, train

log = logging.getLogger(__name__)
app = ClientApp()


@lru_cache(maxsize=4)
def _config(items: tuple[tuple[str, object], ...]) -> TaskConfig:
    return parse_task_config(dict(items))


def _data_dir(cfg: TaskConfig, context: Context) -> Path:
    """A SuperNode's own ``data-dir`` node config, else the run config's, else the default."""
    node_dir = context.node_config.get("data-dir")
    if isinstance(node_dir, str) and node_dir:
        return Path(node_dir)
    return resolve_data_dir(cfg.data_dir or None)


def _device(cfg: TaskConfig, context: Context) -> torch.device:
    """A SuperNode's own ``device`` node config, else the run config's (``auto``: CUDA where
    this node has it, else the CPU)."""
    name = context.node_config.get("device")
    if isinstance(name, str) and name:
        if problems := device_problems(name, key="node config device"):
            raise ValueError(problems[0])
        return resolve(name)
    return resolve(cfg.device)


def _client_id(context: Context) -> str:
    """This client's stable name: node config ``client-id``, else ``partition-id``."""
    node = context.node_config
    name = node.get("client-id", node.get("partition-id"))
    if name is None or str(name) == "":
        raise ValueError(f"node config {dict(node)} names no client: start the SuperNode with "
                         "--node-config 'client-id=\"site-a\"' or 'partition-id=0 ...'")
    return str(name)


def _partition(cfg: TaskConfig, context: Context
               ) -> tuple[torch.Tensor, torch.Tensor, str, Attack | None]:
    """(x, y, training seed name, its attack or None when honest) of this node's partition (a
    Sybil's data and seed name are its group master's, see :mod:`fedowen_task.adversary`)."""
    node = context.node_config
    try:
        pid, num = int(node["partition-id"]), int(node["num-partitions"])
    except KeyError as err:
        raise ValueError(f"node config {dict(node)} lacks {err}; start the SuperNode with "
                         "--node-config 'partition-id=0 num-partitions=N'") from err
    if not 0 <= pid < num:
        raise ValueError(f"partition-id={pid} must lie in [0, num-partitions={num})")
    ds = _dataset(cfg, context)
    split = federated_split(ds, num_clients=num, alpha=cfg.alpha,
                            imbalance_factor=cfg.imbalance_factor, seed=cfg.seed,
                            scheme=cfg.partition_scheme, min_size=cfg.min_partition_size,
                            eval_fraction=cfg.eval_fraction,
                            validation_fraction=cfg.validation_fraction)
    adversary = cfg.adversary()
    adversaries, name = adversary.ids(num), _client_id(context)
    attack = attack_of(adversary) if pid in adversaries else None
    if attack is not None and attack.sybil:
        pid = sybil_master(adversaries)
        name = str(pid)
    idx = split.client_idx[pid]
    if cfg.client_max_samples and len(idx) > cfg.client_max_samples:
        rng = np.random.default_rng([cfg.seed, pid])
        idx = np.sort(rng.choice(idx, size=cfg.client_max_samples, replace=False))
    x = to_tensor(ds.x_train[idx], ds.name)
    y = torch.as_tensor(ds.y_train[idx], dtype=torch.long)
    return x, y, name, attack


def _rank(cfg: TaskConfig, context: Context, attack: Attack | None) -> int:
    """This partition's place among the adversaries (DBA's bar); -1 when it is honest."""
    if attack is None:
        return -1
    node = context.node_config
    return cfg.adversary().rank(int(node["partition-id"]), int(node["num-partitions"]))


def _dataset(cfg: TaskConfig, context: Context) -> DatasetArrays:
    """The run's dataset (cached in-process by :func:`fedowen_task.data.load_dataset`)."""
    return load_dataset(cfg.dataset, _data_dir(cfg, context), download=cfg.download)


def _model(cfg: TaskConfig, msg: Message, context: Context) -> torch.nn.Module:
    ds = _dataset(cfg, context)
    model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes)
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return model


def _seed(run_seed: int, server_round: int, name: str) -> int:
    """A training or attack seed, independent per (run seed, round, name)."""
    return int(np.random.SeedSequence([run_seed, server_round, zlib.crc32(name.encode())]
                                      ).generate_state(1)[0])


def _ray_node() -> str:
    """The id of the Ray node running this call, "" outside a Ray worker (the inline backend,
    a SuperNode). Never imports Ray: a Ray worker has, everything else need not."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    return str(ray.get_runtime_context().get_node_id())


def _named(content: RecordDict, client_id: str) -> RecordDict:
    """Name the reply's client; on a Ray cluster also its node (the round records list which
    node trained whom: ``ray_nodes``)."""
    record = ConfigRecord({CLIENT_ID_FIELD: client_id})
    if node := _ray_node():
        record[RAY_NODE_FIELD] = node
    content[CLIENT_RECORD_KEY] = record
    return content


@app.query()
def query_handler(msg: Message, context: Context) -> Message:
    """Name this client (the server orders nodes by client id before it selects any); when
    the query carries a model and asks for ``local-loss`` (Power-of-Choice's candidates),
    also the model's mean loss on this client's partition."""
    content = RecordDict()
    config = msg.content.config_records.get("config")
    if config is not None and config.get(LOCAL_LOSS_FIELD):
        cfg = _config(tuple(sorted(context.run_config.items())))
        x, y, _, _ = _partition(cfg, context)
        loss, _ = evaluate(_model(cfg, msg, context), x, y, device=_device(cfg, context))
        content["metrics"] = MetricRecord({LOCAL_LOSS_FIELD: loss, NUM_EXAMPLES_FIELD: len(y)})
    return Message(content=_named(content, _client_id(context)), reply_to=msg)


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train locally for ``local-epochs`` and return the weights (or misbehave, when this
    partition is one of the run's adversaries; see :mod:`fedowen_task.adversary`)."""
    cfg = _config(tuple(sorted(context.run_config.items())))
    x, y, seed_name, attack = _partition(cfg, context)
    client_id = _client_id(context)
    model = _model(cfg, msg, context)
    train_config = msg.content.config_records["config"]
    server_round = train_config.get("server-round", 0)
    if not isinstance(server_round, int):
        raise ValueError(f"server-round={server_round!r} in the train config must be an int")
    mu = train_config.get("proximal-mu", 0.0)
    if isinstance(mu, bool) or not isinstance(mu, int | float) or mu < 0:
        raise ValueError(f"proximal-mu={mu!r} in the train config must be a number >= 0")
    seed = _seed(cfg.seed, server_round, seed_name)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    squares = bool(train_config.get(LOSS_SQUARES_FIELD, 0))  # Oort asks
    variance = bool(train_config.get(GRAD_VARIANCE_FIELD, 0))  # DELTA asks
    scale = variance or bool(train_config.get(STEP_SCALE_FIELD, 0))  # (and HiCS-FL)
    stats = {"loss": float("nan"), "loss_squares": 0.0}
    ds = _dataset(cfg, context)
    turn = ClientTurn(cfg.adversary(), server_round, seed,
                      _seed(cfg.seed, server_round, f"attack-{client_id}"), context.state,
                      ds.num_classes, ds.name, white(ds.name), _rank(cfg, context, attack))
    if attack is None or not attack.idle:
        with (attack.training(model, global_state, x, y, turn) if attack is not None
              else nullcontext()):  # a gradient mask is read from the clean data
            if attack is not None and attack.data is not None:  # the model's classes: the data's
                x, y = attack.data(x, y, turn)
            stats = train(model, x, y, **cfg.train_config().train_kwargs(),
                          proximal_mu=float(mu), seed=seed, loss_squares=squares,
                          grad_variance=variance, device=_device(cfg, context))
    # back on the CPU whatever device trained: the reply's arrays (and an attack's) are numpy
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if attack is not None:
        state = attack.client_reply(global_state, state, turn)
    metrics = MetricRecord({"train-loss": float(stats["loss"]), NUM_EXAMPLES_FIELD: len(y),
                            UNIT_WEIGHT_FIELD: 1})
    if squares:
        metrics[LOSS_SQUARES_FIELD] = float(stats["loss_squares"])
    if variance and "grad_variance" in stats:  # an idle attacker trained nothing: no estimate
        metrics[GRAD_VARIANCE_FIELD] = float(stats["grad_variance"])
    if scale and "step_scale" in stats:
        metrics[STEP_SCALE_FIELD] = float(stats["step_scale"])
    content = RecordDict({"arrays": ArrayRecord(state), "metrics": metrics})
    return Message(content=_named(content, client_id), reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this client's partition (federated evaluation: this
    app's ServerApp evaluates centrally, but FedOwen as a drop-in FedAvg, or any Flower
    strategy, sends evaluate messages whenever ``fraction_evaluate > 0``)."""
    cfg = _config(tuple(sorted(context.run_config.items())))
    x, y, _, _ = _partition(cfg, context)
    client_id = _client_id(context)
    loss, acc = evaluate(_model(cfg, msg, context), x, y, device=_device(cfg, context))
    content = RecordDict({
        "metrics": MetricRecord({"eval-loss": loss, "eval-accuracy": acc,
                                 NUM_EXAMPLES_FIELD: len(y)}),
    })
    return Message(content=_named(content, client_id), reply_to=msg)
