"""studies.ablation.selection_sizes: does a sweep's selection favour clients with more examples?"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from studies.ablation.selection_sizes import selection_counts, size_bias


def test_size_bias_by_hand() -> None:
    # Prepare: sizes 10, 20, 70 (mean 100/3); client 2 selected 3 times, client 0 once
    sizes, counts = np.array([10, 20, 70]), np.array([1, 0, 3])
    # Execute
    ratio, corr = size_bias(sizes, counts)
    # Assert: selected examples per selection (10 + 210) / 4 = 55 over the mean size 100/3
    assert math.isclose(ratio, 55 / (100 / 3))
    assert math.isclose(corr, float(np.corrcoef(np.log(sizes), counts)[0, 1]))
    # uniform selection is size-neutral; no selection or equal sizes leave corr undefined
    assert math.isclose(size_bias(sizes, np.ones(3))[0], 1.0)
    assert math.isnan(size_bias(sizes, np.ones(3))[1])
    assert all(math.isnan(x) for x in size_bias(sizes, np.zeros(3)))


def test_selection_counts_read_every_round(tmp_path: Path) -> None:
    rounds = [{"round": 0}, {"round": 1, "selected": ["0", "3"]},
              {"round": 2, "selected": ["3", "1"]}]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    np.testing.assert_array_equal(selection_counts(tmp_path, 4), [1, 1, 0, 2])
