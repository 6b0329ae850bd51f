"""What a cell ran on (sim.cell_state, issue 60): every attempt's record names the machine, and
the runner warns when one setting's cells ran on more than one (PROTOCOL section 7's "one
machine per setting"); records written before keep reading."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch

from fedowen_task.device import resolve
from sim.cell_state import CODE_FILE, MACHINE_FILE, cell_machines, machine_state, mixed_machines
from tests.fake_runner import FakeFlwr, Outcome, make_runner, small_preset


def test_every_attempt_names_the_machine_it_ran_on(tmp_path: Path) -> None:
    # Prepare
    runner = make_runner(tmp_path, FakeFlwr([]))
    # Execute
    runner.run()
    # Assert: host name hashed (not written), CPU, cores, torch, CUDA and the device used
    for cell in runner.preset.cells():
        (machine,) = cell_machines(runner.results / cell.cell_id)
        assert len(machine["host"]) == 12 and socket.gethostname() not in json.dumps(machine)
        assert machine["cores"] == os.cpu_count() and machine["cpu"]
        assert machine["torch"] == torch.__version__ and machine["cuda"] == torch.version.cuda
        assert machine["device"] == str(resolve("auto"))
    assert machine_state("cpu")["device"] == "cpu" and machine_state("cpu")["gpu"] is None


def test_a_cell_run_on_another_node_records_that_node(tmp_path: Path) -> None:
    # Prepare: a Ray worker leaves its own record in the cell's folder (sim.cluster_task)
    class ElsewhereFlwr(FakeFlwr):
        def __call__(self, link: Any, cfg: dict[str, Any], **kw: Any) -> Outcome:
            node = {**machine_state("cpu"), "host": "0123456789ab", "cores": 64}
            (Path(cfg["output-dir"]) / MACHINE_FILE).parent.mkdir(parents=True, exist_ok=True)
            (Path(cfg["output-dir"]) / MACHINE_FILE).write_text(json.dumps(node))
            return super().__call__(link, cfg, **kw)

    runner = make_runner(tmp_path, ElsewhereFlwr([]))
    # Execute
    runner.run()
    # Assert: the node's record, not the driver's; the hand-over file is gone
    out = runner.results / runner.preset.cells()[0].cell_id
    assert [m["host"] for m in cell_machines(out)] == ["0123456789ab"]
    assert not (out / MACHINE_FILE).exists()


def test_the_runner_warns_when_a_settings_cells_ran_on_two_machines(tmp_path: Path) -> None:
    # Prepare: one setting (valuation=owen), two seeds; the second seed's record says another
    # host; and a record from before issue 60 (no machine) beside them
    messages: list[str] = []
    runner = make_runner(tmp_path, FakeFlwr([]), small_preset(
        axes={"seed": [0, 1, 2], "valuation": ["owen"]}))
    runner.progress = messages.append
    runner.run()
    assert not [m for m in messages if m.startswith("warning")]  # one machine so far
    cells = [runner.results / c.cell_id for c in runner.preset.cells()]
    code = json.loads((cells[1] / CODE_FILE).read_text())
    code[-1]["machine"] = {**code[-1]["machine"], "host": "feedfacecafe", "device": "cuda",
                           "gpu": "NVIDIA H200"}
    (cells[1] / CODE_FILE).write_text(json.dumps(code))
    old = json.loads((cells[2] / CODE_FILE).read_text())
    (cells[2] / CODE_FILE).write_text(json.dumps([{k: v for k, v in a.items() if k != "machine"}
                                                 for a in old]))
    # Execute
    runner.warn_mixed_machines()
    # Assert: the setting named with both machines; the old record reads as none
    assert cell_machines(cells[2]) == []
    (warning,) = [m for m in messages if m.startswith("warning")]
    assert "the cells of grid t ran on 2 machines" in warning
    assert "host feedfacecafe, cuda (NVIDIA H200)" in warning
    assert mixed_machines(runner.results, {"just the old one": [cells[2].name]}) == {}


def test_two_cpus_of_one_model_name_that_pick_other_kernels_are_two_machines(
        tmp_path: Path) -> None:
    # Prepare: one setting, two seeds on one host whose CPU model name is the same; the
    # second seed's record says its CPU had AVX-512 (another kind of virtual "AMD EPYC")
    messages: list[str] = []
    runner = make_runner(tmp_path, FakeFlwr([]), small_preset(
        axes={"seed": [0, 1], "valuation": ["owen"]}))
    runner.progress = messages.append
    runner.run()
    here = machine_state("cpu")["kernels"]
    cells = [runner.results / c.cell_id for c in runner.preset.cells()]
    code = json.loads((cells[1] / CODE_FILE).read_text())
    code[-1]["machine"] = {**code[-1]["machine"], "kernels": "AVX512 [avx512f avx2 fma avx]"}
    (cells[1] / CODE_FILE).write_text(json.dumps(code))
    # Execute
    runner.warn_mixed_machines()
    # Assert: this CPU's kernels are recorded (torch's capability first) and the two differ
    assert here.split(" [")[0] == torch.backends.cpu.get_cpu_capability()
    (warning,) = [m for m in messages if m.startswith("warning")]
    assert "AVX512 [avx512f avx2 fma avx]" in warning and here in warning
