"""Experiment presets and the resumable runner (flwr run faked; the reports are
test_reports.py's). No Ray here; the real preset run is ``slow``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from server_app.config import parse_run_config
from server_app.keys import defaults_hash
from sim.cell_state import CODE_FILE, STATE_FILE, read_state
from sim.grid import cell_id
from sim.presets import PresetError, load_preset, parse_preset
from sim.report import write_report
from sim.runner import Runner
from tests.fake_runner import FakeFlwr, make_runner, small_preset

CONF = Path(__file__).resolve().parents[1] / "conf"



def test_grid_expands_to_product_seed_first() -> None:
    # Execute
    cells = parse_preset(small_preset()).cells()
    # Assert: 2 seeds x 2 alphas x 2 methods, all seed-0 cells first, ids unique
    assert len(cells) == 8
    assert [c.run_config["seed"] for c in cells] == [0] * 4 + [1] * 4
    assert len({c.cell_id for c in cells}) == 8
    assert cells[0].run_config == {"dataset": "mnist", "num-server-rounds": 3, "seed": 0,
                                   "alpha": 0.01, "valuation": "owen"}


def test_cell_id_is_stable_and_ignores_paths_and_key_order() -> None:
    # Prepare
    cfg = {"alpha": 0.1, "valuation": "owen", "seed": 0}
    # Assert
    assert cell_id(cfg, 100) == cell_id(dict(reversed(cfg.items())), 100)
    assert cell_id(cfg, 100) == cell_id({**cfg, "output-dir": "/x", "data-dir": "/y"}, 100)
    assert cell_id(cfg, 100) != cell_id({**cfg, "seed": 1}, 100)
    assert cell_id(cfg, 100) != cell_id(cfg, 10)
    assert len(cell_id(cfg, 100)) == 12


def test_shared_cells_of_two_grids_run_once() -> None:
    # Prepare: the second grid repeats the owen cells of the first
    raw = small_preset()
    raw["grid"].append({"name": "again", "set": {"valuation": "owen"},
                        "axes": {"seed": [0, 1], "alpha": [0.01, 0.1]}})
    # Execute / Assert
    assert len(parse_preset(raw).cells()) == 8


def test_auto_selection_pins_what_auto_meant_into_the_cells_that_value_clients() -> None:
    # Prepare: a preset declaring that auto meant Algorithm 2; owen and none cells, one owen
    # cell with its selection written
    raw = small_preset()
    raw["preset"]["auto-selection"] = "adaptive"
    raw["grid"][0]["axes"] = {"seed": [0], "valuation": ["owen", "none"],
                              "selection": ["auto", "random"]}
    # Execute
    cells = parse_preset(raw).cells()
    # Assert: pinned only where auto was left and phi is computed; the id is the explicit one's
    by = {(c.point["valuation"], c.point["selection"]): c for c in cells}
    assert by["owen", "auto"].run_config["selection"] == "adaptive"
    assert by["none", "auto"].run_config["selection"] == "auto"  # auto: random, as always
    assert by["owen", "random"].run_config["selection"] == "random"
    explicit = dict(by["owen", "auto"].run_config)
    assert by["owen", "auto"].cell_id == cell_id(explicit, 10)
    assert parse_preset(raw).to_json()["preset"]["auto-selection"] == "adaptive"
    raw["preset"]["auto-selection"] = "oort"
    with pytest.raises(PresetError, match="auto-selection='oort' must be one of"):
        parse_preset(raw)


def test_no_committed_preset_leaves_a_valuing_cell_to_an_unpinned_auto_selection() -> None:
    # A change of what auto selection means renames every cell that leaves it to auto (the id
    # resolves it): a preset with committed cells pins auto-selection or writes selection out.
    from fedowen_strategy.round.round_valuers import NO_PHI
    from server_app.config import RunConfig

    presets = [load_preset(p) for p in sorted(CONF.glob("**/*.toml"))]
    unpinned = {p.name: c.cell_id for p in presets for c in p.cells()
                if c.run_config.get("selection", "auto") == "auto"
                and str(c.run_config.get("valuation", RunConfig.valuation)) not in NO_PHI}
    assert len(presets) > 20  # it looked
    assert unpinned == {}, ("pin [preset] auto-selection (what auto means today) in these "
                            f"presets, or write selection in their grids: {unpinned}")


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.update(extra=1), "unknown key 'extra'"),
    (lambda r: r["preset"].update(supernodes=3), "unknown key 'supernodes'"),
    (lambda r: r["grid"][0].update(colour="red"), "unknown key 'colour'"),
    (lambda r: r["base"].update(alhpa=0.1), "unknown key 'alhpa'"),
    (lambda r: r["grid"][0]["axes"].update(valuation=["owne"]), "valuation='owne'"),
    (lambda r: r["grid"][0].update(kind="sweep"), "a sweep needs x"),
    (lambda r: r["base"].update({"output-dir": "/tmp/x"}), "set by the runner"),
    (lambda r: r["grid"][0].update(axes={}), "axes must map"),
])
def test_invalid_presets_fail_with_a_clear_message(mutate: Any, message: str) -> None:
    # Prepare
    raw = small_preset()
    mutate(raw)
    # Execute / Assert
    with pytest.raises(PresetError, match=message):
        parse_preset(raw)


def test_committed_presets_parse_with_the_documented_sizes() -> None:
    # Execute
    cpu = load_preset(CONF / "paper-mnist-cpu.toml")
    full = load_preset(CONF / "paper-full.toml")
    adv = load_preset(CONF / "adversarial-mnist.toml")
    # Assert: 7 methods x 2 alphas x 3 seeds; the full grid 630 + 45 + 60 + 90 distinct cells
    assert len(cpu.cells()) == 42
    assert {c.run_config["dataset"] for c in cpu.cells()} == {"mnist"}
    assert len(full.cells()) == 825
    assert full.base["num-server-rounds"] == 100
    assert len(adv.cells()) == 18
    krum = {(c.run_config["adversary-fraction"], c.run_config["krum-malicious"])
            for c in adv.cells()}
    assert krum == {(0.2, 2), (0.3, 3)}


def test_the_backbone_grid_is_equal_weight_fedavg_on_the_papers_cifar10_setting() -> None:
    # Execute
    preset = load_preset(CONF / "backbone-dev.toml")
    cells = preset.cells()
    # Assert: 2 models x 2 lrs x seeds 0-2, every cell equal-weight FedAvg on CIFAR-10 at
    # IF 0.01, alpha 0.1, validation 5%, 100-image clients, 8 rounds
    assert len(cells) == 12
    arms = {(c.run_config["model"], c.run_config["lr"]) for c in cells}
    assert arms == {("resnet18", 0.01), ("resnet18", 0.03), ("resnet18-gn", 0.003),
                    ("resnet18-gn", 0.01)}
    assert {c.run_config["seed"] for c in cells} == {0, 1, 2}
    for cell in cells:
        cfg = parse_run_config(cell.run_config)
        assert (cfg.valuation, cfg.selection, cfg.aggregation) == ("none", "random", "uniform")
        assert (cfg.dataset, cfg.imbalance_factor, cfg.alpha, cfg.validation_fraction) == (
            "cifar10", 0.01, 0.1, 0.05)
        assert (cfg.client_max_samples, cfg.num_server_rounds, cfg.momentum) == (100, 8, 0.5)


# ---------------------------------------------------------------- runner (flwr run faked)

def test_done_cells_are_not_run_again(tmp_path: Path) -> None:
    # Prepare
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake)
    # Execute
    first = runner.run()
    second = runner.run()
    # Assert
    assert first["done"] == 2 and len(fake.calls) == 2
    assert second == {"done": 2, "failed": 0, "skipped-failed": 0, "not-run": 0}
    assert len(fake.calls) == 2
    assert fake.calls[0]["output-dir"].endswith(runner.preset.cells()[0].cell_id)
    assert "resume-from" not in fake.calls[0]


def test_a_cell_finished_under_other_defaults_is_not_counted_as_done(tmp_path: Path) -> None:
    # Prepare: two finished cells; the first ran when momentum's default was 0.9 (its record
    # names other defaults), the second's record predates the hash (it reads as written)
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake)
    runner.run()
    moved, old = (runner.results / c.cell_id for c in runner.preset.cells())
    for out, momentum, defaults in ((moved, 0.9, "0123456789ab"), (old, 0.9, None)):
        cell = next(c for c in runner.preset.cells() if c.cell_id == out.name)
        recorded = asdict(parse_run_config(cell.run_config)) | {"momentum": momentum}
        (out / "config.json").write_text(json.dumps(recorded))
        code = json.loads((out / CODE_FILE).read_text())
        assert code[-1]["defaults"] == defaults_hash()  # what a new record names
        code[-1]["defaults"] = defaults
        if defaults is None:
            del code[-1]["defaults"]
        (out / CODE_FILE).write_text(json.dumps(code))
    messages: list[str] = []
    runner.progress = messages.append
    # Execute
    counts = runner.run()
    # Assert: not done, not run over its records, and the moved key named
    assert counts == {"done": 1, "failed": 0, "skipped-failed": 0, "not-run": 0,
                      "moved-defaults": 1}
    assert len(fake.calls) == 2
    assert any(moved.name in m and "momentum 0.9 -> 0.5" in m for m in messages), messages


def test_failed_cell_is_retried_once_then_marked_failed(tmp_path: Path) -> None:
    # Prepare: the first cell fails twice, the second succeeds
    fake = FakeFlwr(["fail", "fail", "ok"])
    runner = make_runner(tmp_path, fake)
    # Execute
    counts = runner.run()
    again = runner.run()
    # Assert
    first = runner.preset.cells()[0].cell_id
    events = read_state(runner.results)[first]
    assert counts["failed"] == 1 and counts["done"] == 1 and len(fake.calls) == 3
    assert [e["event"] for e in events] == ["error", "error", "failed"]
    assert "finished:failed" in events[-1]["error"] and "boom" in events[-1]["log_tail"]
    assert again["skipped-failed"] == 1 and len(fake.calls) == 3
    # --retry-failed runs it again
    assert runner.run(retry_failed=True)["done"] == 2


def test_crashed_cell_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    # Prepare
    fake = FakeFlwr(["crash-after-ckpt", "ok"])
    runner = make_runner(tmp_path, fake)
    # Execute
    counts = runner.run(limit=1)
    # Assert: the retry continues from the checkpoint; the other cell was not started
    assert counts == {"done": 1, "failed": 0, "skipped-failed": 0, "not-run": 1}
    assert "resume-from" not in fake.calls[0]
    assert fake.calls[1]["resume-from"] == fake.calls[1]["output-dir"]
    lines = (runner.results / STATE_FILE).read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["error", "done"]
    # each attempt recorded the code it ran: this checkout's commit
    from sim.cell_state import code_state

    code = json.loads((Path(fake.calls[1]["output-dir"]) / "code.json").read_text())
    assert [(a["attempt"], a["resumed"]) for a in code] == [(1, False), (2, True)]
    assert code[0]["commit"] == code_state()["commit"]
    assert code[0]["commit"] is None or len(code[0]["commit"]) == 40


def test_a_crashed_cell_of_a_strategy_without_checkpointed_state_starts_again(
        tmp_path: Path) -> None:
    # FedAvgM's server momentum is not in the checkpoint: resuming would refuse the run config
    raw = small_preset(axes={"seed": [0], "strategy": ["fedavgm"]}, rows="strategy")
    fake = FakeFlwr(["crash-after-ckpt", "ok"])
    counts = make_runner(tmp_path, fake, raw).run()
    assert counts["done"] == 1 and len(fake.calls) == 2
    assert "resume-from" not in fake.calls[1]


def test_run_selects_one_grid(tmp_path: Path) -> None:
    # Prepare
    raw = small_preset(axes={"seed": [0], "valuation": ["owen"]})
    raw["grid"].append({"name": "other", "axes": {"seed": [0], "valuation": ["none"]}})
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake, raw)
    # Execute
    runner.run(grids=["other"])
    # Assert
    assert [c["valuation"] for c in fake.calls] == ["none"]


def test_run_keeps_the_cells_where_an_axis_has_a_value(tmp_path: Path) -> None:
    # Prepare: two alphas x two valuations
    raw = small_preset(axes={"seed": [0], "alpha": [0.1, 0.01], "valuation": ["owen", "none"]})
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake, raw)
    # Execute
    runner.run(where={"alpha": 0.01})
    # Assert: one setting's cells alone; a value no cell has is an error that says what to give
    assert sorted((c["alpha"], c["valuation"]) for c in fake.calls) == [(0.01, "none"),
                                                                         (0.01, "owen")]
    with pytest.raises(KeyError, match=r"alpha=0\.5 matches none of the 4 cells"):
        runner.selected_cells(where={"alpha": 0.5})


def test_status_counts_each_grids_finished_cells(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: two grids, the first run whole, the second not at all
    from sim.experiments import main

    raw = small_preset(axes={"seed": [0], "valuation": ["owen", "none"]})
    raw["grid"].append({"name": "other", "axes": {"seed": [1], "valuation": ["none"]}})
    runner = make_runner(tmp_path, FakeFlwr([]), raw)
    runner.run(grids=[raw["grid"][0]["name"]])
    # Execute
    main(["status", "--results", str(tmp_path / "res")])
    # Assert
    out = capsys.readouterr().out
    assert f"by grid: {raw['grid'][0]['name']} 2/2, other 0/1" in out


def test_where_reads_its_value_as_toml_else_as_text() -> None:
    from sim.experiments import parse_args

    args = parse_args(["run", "conf/x.toml", "--where", "alpha=0.01", "--where",
                       "variant=fedowen"])
    assert args.where == {"alpha": 0.01, "variant": "fedowen"}
    with pytest.raises(SystemExit):
        parse_args(["run", "conf/x.toml", "--where", "alpha"])


@pytest.mark.slow
@pytest.mark.e2e
def test_real_flwr_run_preset_resumes_and_reports(tmp_path: Path, shared_data_dir: Path) -> None:
    """One tiny cell through a real ``flwr run`` (Ray); a second invocation skips it."""
    from fedowen_deploy.launcher import LocalSuperLink, flwr_run

    # Prepare
    raw = {"preset": {"name": "e2e", "num-supernodes": 4, "cell-timeout": 600},
           "base": {"dataset": "mnist", "num-server-rounds": 2, "clients-per-round": 2,
                    "client-max-samples": 50, "test-max-samples": 500},
           "grid": [{"name": "t", "axes": {"seed": [0], "valuation": ["owen"]}}]}
    preset = parse_preset(raw)
    runner = Runner(preset, tmp_path / "res", shared_data_dir, run_fn=flwr_run,
                    link_factory=LocalSuperLink, progress=lambda msg: None)
    # Execute
    first = runner.run()
    second = runner.run()
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    assert first["done"] == 1 and second["done"] == 1
    assert len(read_state(tmp_path / "res")[preset.cells()[0].cell_id]) == 1
    assert "Cells finished: 1 of 1" in (tmp_path / "out" / "README.md").read_text()


def test_a_preset_whose_cells_cannot_split_their_data_stops_before_any_cell(
        tmp_path: Path, shared_data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.experiments import main

    # Prepare: BreastMNIST's 546 images for 100 clients of 10 at IF 0.01 (paper-full's setting),
    # beside MNIST cells that fit
    preset = tmp_path / "p.toml"
    preset.write_text(
        '[preset]\nname = "p"\nnum-supernodes = 100\nbackend = "inline"\n'
        '[base]\nnum-server-rounds = 1\nvaluation = "none"\n'
        '[[grid]]\nname = "g"\naxes = { seed = [0, 1], dataset = ["mnist", "medmnist"] }\n')
    # Execute
    with pytest.raises(SystemExit) as stop:
        main(["run", str(preset), "--results", str(tmp_path / "res"), "--data-dir",
              str(shared_data_dir)])
    # Assert: the count, one cell's reason in the config's words, and no cell started
    said = str(stop.value)
    assert "2 of 4 cells cannot split their data among num-supernodes = 100" in said, said
    assert "dataset=medmnist: the clients' pool keeps" in said and "nothing ran" in said
    assert not (tmp_path / "res").exists() or not any(
        p.is_dir() for p in (tmp_path / "res").iterdir())


def test_a_preset_whose_data_is_missing_stops_before_any_cell_naming_the_folder(
        tmp_path: Path) -> None:
    from sim.experiments import main

    preset = tmp_path / "p.toml"
    preset.write_text('[preset]\nname = "p"\nnum-supernodes = 4\nbackend = "inline"\n'
                      '[base]\nnum-server-rounds = 1\n[[grid]]\nname = "g"\n'
                      'axes = { seed = [0], valuation = ["none"] }\n')
    with pytest.raises(SystemExit, match=r"\[experiments\] p: data-dir=.*nowhere.*not found"):
        main(["run", str(preset), "--results", str(tmp_path / "res"), "--data-dir",
              str(tmp_path / "nowhere")])
