"""The example ServerApp in docs/examples (FedOwen with its own model) runs and learns."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from sim.inline_grid import InProcessGrid

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "fedowen_serverapp.py"
FLIPPED = {4, 5}  # these clients train on wrong labels


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fedowen_serverapp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_client(example: ModuleType):  # type: ignore[no-untyped-def]
    def handler(msg: Message, ctx: Context) -> Message:
        pid = int(ctx.node_config["partition-id"])
        named = RecordDict({"client": ConfigRecord({"client-id": f"c{pid}"})})
        if msg.metadata.message_type == "query":
            return Message(named, reply_to=msg)
        model = example.make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x = torch.randn(200, 8, generator=torch.Generator().manual_seed(100 + pid))
        y = x[:, :3].argmax(dim=1)
        y = (y + 1) % 3 if pid in FLIPPED else y
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        named["arrays"] = ArrayRecord(model.state_dict())
        named["metrics"] = MetricRecord({"num-examples": 200, "train-loss": float(loss)})
        return Message(named, reply_to=msg)

    return handler


def test_example_serverapp_runs_fedowen_with_its_own_model() -> None:
    # Prepare
    example = load_example()
    grid = InProcessGrid(make_client(example), [{"partition-id": i} for i in range(8)])
    # Execute
    result = example.run(grid, num_rounds=3)
    # Assert: the model learns; each round's metrics hold phi and weights of the 4 clients
    # (fraction_train 0.5 of 8) and the clients' own train-loss
    acc = result.evaluate_metrics_serverapp
    assert acc[3]["accuracy"] > acc[0]["accuracy"] + 0.2
    for metrics in result.train_metrics_clientapp.values():
        assert len([k for k in metrics if k.startswith("phi/")]) == 4
        assert "train-loss" in metrics and metrics["n-evals"] > 0
