"""Sybil links measured from round records (studies.adversarial.sybil_links)."""

from __future__ import annotations

from studies.adversarial.sybil_links import link_counts, pair_cosines

ADV = frozenset({"7", "8"})
# returned 1, 7, 2, 8: pairs (1,7) (1,2) (1,8) (7,2) (7,8) (2,8)
ROUND = {"round": 3, "returned": ["1", "7", "2", "8"],
         "cosines": [0.1, 0.5, 0.2, 0.3, 0.99, 0.4], "links": [["7", "8"]]}


def test_pair_cosines_split_honest_and_adversary_pairs() -> None:
    # Execute
    honest, bad, skipped = pair_cosines([ROUND, {"round": 4}], ADV)
    # Assert: (1, 2) is the only honest pair, (7, 8) the only adversary pair; mixed pairs out
    assert honest == [0.5] and bad == [0.99] and skipped == 0


def test_pair_cosines_skip_a_round_whose_cosines_do_not_match_its_replies() -> None:
    honest, bad, skipped = pair_cosines([{**ROUND, "cosines": [0.1, 0.2]}], ADV)
    assert (honest, bad, skipped) == ([], [], 1)


def test_link_counts_false_links_and_catches() -> None:
    # Prepare: round 2 links honest 1 with adversary 7 (a false link for 1)
    other = {"round": 5, "returned": ["1", "2", "7"], "links": [["1", "7"]]}
    # Execute
    out = link_counts([ROUND, other], ADV)
    # Assert: honest client-rounds 2 + 2, one linked; adversaries counted where >= 2 returned
    assert out.honest_rounds == 4 and out.honest_linked == 1
    assert out.false_clients == {"1"}
    assert out.adv_rounds == 2 and out.adv_linked == 2  # round 5 has one adversary: not counted
    assert out.rounds_with_links == 2
