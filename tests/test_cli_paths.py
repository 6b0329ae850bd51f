"""The launcher's path keys (fedowen_deploy.cli): ``--set output-dir=PATH`` and ``--set
data-dir=PATH`` mean what the flags mean. Before, the run silently wrote to a new folder under
~/fedowen-runs (and read the default data) whatever ``--set`` said."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedowen_deploy.cli import build_run_config, parse_args


def test_set_output_dir_and_data_dir_are_the_flags(tmp_path: Path) -> None:
    # Prepare
    args = parse_args(["--set", f"output-dir={tmp_path / 'out'}",
                       "--set", f"data-dir={tmp_path / 'data'}", "--set", "alpha=0.01"])
    # Execute
    cfg = build_run_config(args)
    # Assert
    assert cfg["output-dir"] == str((tmp_path / "out").resolve())
    assert cfg["data-dir"] == str((tmp_path / "data").resolve())
    assert cfg["alpha"] == 0.01


def test_the_same_folder_both_ways_is_one_folder(tmp_path: Path) -> None:
    # Prepare
    args = parse_args(["--output-dir", str(tmp_path), "--set", f"output-dir={tmp_path}"])
    # Execute / Assert
    assert build_run_config(args)["output-dir"] == str(tmp_path.resolve())


def test_two_folders_both_ways_stop_naming_both(tmp_path: Path) -> None:
    # Prepare
    args = parse_args(["--output-dir", str(tmp_path / "a"),
                       "--set", f"output-dir={tmp_path / 'b'}"])
    # Execute / Assert
    with pytest.raises(SystemExit, match=r"output-dir=.*b and --output-dir .*a name two folders"):
        build_run_config(args)
