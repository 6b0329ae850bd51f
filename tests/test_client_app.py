"""ClientApp details: where a SuperNode's data comes from, and a bad node config."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from client_app.app import _data_dir, _partition
from server_app.config import parse_run_config


def ctx(node: dict[str, object]) -> Context:
    return Context(run_id=1, node_id=1, node_config=node, state=RecordDict(),  # type: ignore[arg-type]
                   run_config={})


def test_node_data_dir_wins_over_run_config(tmp_path: Path) -> None:
    cfg = parse_run_config({"data-dir": "/run/config/dir"})
    assert _data_dir(cfg, ctx({"data-dir": str(tmp_path)})) == tmp_path
    assert _data_dir(cfg, ctx({})) == Path("/run/config/dir")


def test_missing_partition_id_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--node-config 'partition-id=0 num-partitions=N'"):
        _partition(parse_run_config({}), ctx({"client-id": "site-a"}))


def test_partition_id_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"partition-id=5 must lie in \[0, num-partitions=3\)"):
        _partition(parse_run_config({}), ctx({"partition-id": 5, "num-partitions": 3}))
