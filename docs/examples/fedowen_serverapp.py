"""FedOwen in your own ServerApp, with your own model (run by tests/test_example_serverapp.py).

Any ClientApp that returns ``arrays`` and ``metrics`` (with ``num-examples``) works; one that
also names itself (ConfigRecord ``client`` = {"client-id": ...}) keeps its contribution
history across runs.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from fedowen_strategy import FedOwen
from fedowen_strategy.torch_utility import CoalitionUtility

app = ServerApp()


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def server_data(n: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    return x, x[:, :3].argmax(dim=1)  # the class is the largest of the first three features


def run(grid: Grid, num_rounds: int) -> Result:
    model, (x, y) = make_model(), server_data()
    # the app's defaults: owen-antithetic at M = 4 on the delta game with neg-loss, Algorithm
    # 2's selection, the norm cap and the Sybil links (ValuationSettings, SelectionParams and
    # Guards change them)
    strategy = FedOwen(fraction_train=0.5, min_available_nodes=4,
                       utility_factory=CoalitionUtility(model, x, y))

    def accuracy(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": float((model(x).argmax(1) == y).float().mean())})

    return strategy.start(grid=grid, initial_arrays=ArrayRecord(make_model().state_dict()),
                          num_rounds=num_rounds, evaluate_fn=accuracy)


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, int(context.run_config.get("num-server-rounds", 3)))
