"""studies.selection.writer_coverage: the favoured / neglected writers and the accuracy per
group."""

from __future__ import annotations

import math

import numpy as np

from studies.selection.writer_coverage import group_accuracy, quartile_writers


def test_quartile_writers_take_the_most_and_least_selected_clients() -> None:
    # Prepare: 8 clients (writers 100..107) selected 0..7 times; client 0 never
    counts = {i: i for i in range(1, 8)}
    writers = list(range(100, 108))
    # Execute
    favoured, neglected = quartile_writers(counts, writers)
    # Assert: quartiles of 0..7 are 1.75 and 5.25 -> counts >= 5.25 and <= 1.75
    assert favoured == {106, 107}
    assert neglected == {100, 101}


def test_group_accuracy_reads_each_group_on_its_writers_images() -> None:
    # Prepare: 6 images of writers 1, 1, 2, 2, 3, 3; right on the first four and the last
    correct = np.array([True, True, True, False, False, True])
    writers = np.array([1, 1, 2, 2, 3, 3])
    # Execute
    acc = group_accuracy(correct, writers, {"all": None, "one": {1}, "two-three": {2, 3},
                                            "none": {9}})
    # Assert: 4/6, 2/2, 2/4; a group without images is NaN
    assert math.isclose(acc["all"], 100 * 4 / 6)
    assert acc["one"] == 100.0 and acc["two-three"] == 50.0
    assert math.isnan(acc["none"])
