"""ShapFed-WA scores (fedowen_strategy.shapfed)."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.shapfed import shapfed_scores


def test_aligned_client_scores_higher_than_opposed_one() -> None:
    # Prepare: 2 classes, d = 2; clients 0 and 1 move with the federation, client 2 against it
    g = np.zeros((2, 2))
    clients = [
        np.array([[1.0, 0.0], [0.0, 1.0]]),
        np.array([[1.0, 0.0], [0.0, 1.0]]),
        np.array([[-0.5, 0.0], [0.0, -0.5]]),
    ]
    # Execute
    scores = shapfed_scores(clients, g)
    # Assert: aggregate rows are (0.5, 0) and (0, 0.5); cos = 1, 1, -1 -> clip -> 1, 1, 0
    np.testing.assert_allclose(scores, [0.5, 0.5, 0.0])


def test_classwise_cosines_are_averaged_over_classes() -> None:
    # Prepare: client 0 agrees on class 0 only (cos 1 and 0); client 1 on both
    g = np.zeros((2, 2))
    clients = [np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 2.0]])]
    # Aggregate: row0 = (1, 0); row1 = (0.5, 1). By hand:
    cos_01 = 0.5 / np.sqrt(1.25)  # client 0, class 1
    cos_11 = 2.0 / (2.0 * np.sqrt(1.25))  # client 1, class 1
    expected = np.array([(1 + cos_01) / 2, (1 + cos_11) / 2])
    # Execute
    scores = shapfed_scores(clients, g)
    # Assert
    np.testing.assert_allclose(scores, expected / expected.sum())


def test_all_zero_scores_fall_back_to_uniform() -> None:
    g = np.ones((3, 4))
    scores = shapfed_scores([g.copy(), g.copy()], g)
    np.testing.assert_allclose(scores, [0.5, 0.5])


def test_bias_is_appended_as_a_column() -> None:
    # Prepare: weights identical, only the biases differ in direction
    g, gb = np.zeros((2, 1)), np.zeros(2)
    w = [np.zeros((2, 1)), np.zeros((2, 1))]
    b = [np.array([1.0, 1.0]), np.array([-0.2, -0.2])]
    # Execute
    scores = shapfed_scores(w, g, client_biases=b, global_bias=gb)
    # Assert
    np.testing.assert_allclose(scores, [1.0, 0.0])


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="global shape"):
        shapfed_scores([np.zeros((2, 3))], np.zeros((2, 2)))
