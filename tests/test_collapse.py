"""What counts as a collapsed run (studies.confirmation.collapse, issue 60): below 20%, or at
or below the majority-class rate of the split a score is read on, so a binary dataset's arm that
always answers its majority class is flagged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studies.confirmation.collapse import MAJORITY_PERCENT, collapsed, majority_rate


def test_a_binary_datasets_arm_at_its_majority_rate_is_flagged() -> None:
    # Prepare: BreastMNIST's test split is 114 of 156 malignant (73.08%); a 20% rule never fires
    # Execute / Assert
    assert collapsed(73.08, "breastmnist") and collapsed(42.69, "breastmnist")
    assert collapsed(73.08, "medmnist")  # the app's name for it
    assert not collapsed(73.72, "breastmnist")  # one test image above it
    assert collapsed(73.47, "breastmnist", "validation")  # 36 of 49 on the validation split
    # ten-class datasets keep the arena's 20% rule (their majority class is 8-11%)
    assert collapsed(19.9, "mnist") and not collapsed(20.0, "mnist")
    assert collapsed(19.9, "unknown-dataset") and not collapsed(50.0, "unknown-dataset")


def test_the_endpoint_table_flags_a_binary_datasets_arm_at_the_majority_rate() -> None:
    from studies.confirmation.pages import arm_endpoints

    table = {("fedowen", "all"): {200: 80.13, 201: 78.21},
             ("fltrust", "all"): {200: 73.08, 201: 73.08}}
    md = "\n".join(arm_endpoints({"breastmnist": table}))
    row = next(line for line in md.splitlines() if line.startswith("| breastmnist |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # dataset, setting, fedowen, fedavg-equal, fedavgm, fedprox, fltrust
    assert cells[2] == "79.2 (78.2)"
    assert cells[6] == "**73.1 (73.1), 2 of 2 collapsed**"
    assert "breastmnist 73.08%" in md


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist", "cifar10", "femnist",
                                     "medmnist"])
def test_the_stored_majority_rates_are_the_datas(dataset: str, shared_data_dir: Path) -> None:
    # Measured again from the data (the shared fixture: a skip outside CI, a failure under it)
    from fedowen_task.data import load_dataset
    from fedowen_task.holdout import holdout_split

    arrays = load_dataset(dataset, str(shared_data_dir))
    fractions = (0.1, 0.1) if dataset == "medmnist" else (0.01, 0.05)
    _, val, _ = holdout_split(arrays.y_train, *fractions, 50)
    for split, labels in (("test", arrays.y_test), ("validation", arrays.y_train[val])):
        share = 100 * np.bincount(labels).max() / len(labels)
        assert majority_rate(dataset, split) == pytest.approx(share, abs=0.005)
    assert set(MAJORITY_PERCENT["test"]) == set(MAJORITY_PERCENT["validation"])
