"""Run the real ServerApp ``run`` with the real ClientApp over the in-process grid, as its own
process, so a test can kill it mid-run (``python -m tests.server_process <run-config.json>``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flwr.supercore.task_identity import TaskIdentity

from client_app.app import train_handler
from server_app.app import run
from server_app.config import parse_run_config
from tests.fake_grid import InProcessGrid


def main(config_file: str) -> None:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    run_config = json.loads(Path(config_file).read_text())
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    cfg = parse_run_config(run_config)
    run(InProcessGrid(train_handler, nodes, run_config), cfg, cfg.resolved_output_dir(1))


if __name__ == "__main__":
    main(sys.argv[1])
