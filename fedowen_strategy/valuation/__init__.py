"""Shapley-value estimators over utility games (numpy only; no Flower, no torch).

Contract
--------
A utility (game) is any callable ``utility(masks) -> values``: ``masks`` a boolean array of
shape ``(k, n)``, ``values`` ``k`` floats. Estimators pass coalitions in batches.

``estimate(method, utility, n_players, *, budget, seed, **params) -> Valuation``; ``ESTIMATORS``
maps the registered names to their specs (``ESTIMATORS[name].defaults`` lists the parameters).
``Valuation.n_evals`` counts the coalition rows passed to ``utility`` (empty and grand
coalitions included) and is always ``<= budget``; a coalition repeated within one call is
served from a cache and not charged again. ``nu(empty)`` and ``nu(N)`` are evaluated first,
within the budget, for every method (``Valuation.v_empty``, ``Valuation.v_grand``). The same
seed gives the same values.

A utility may also offer ``utility.first_order(at)``, its players' first-order terms (one
gradient; see ``_base``). The methods that use them (``ESTIMATORS[name].uses_first_order``)
refuse a utility without; ``Valuation.n_gradients`` counts the calls, outside the budget.
Those that take the terms at 0 and 1 (``ESTIMATORS[name].ends_from_gradients``) take them
before the ends: the torch utility's backward passes there score the empty and the grand
coalition, so its ``nu(empty)`` and ``nu(N)`` need no forward (still counted in ``n_evals``).

Methods and the axioms they keep
--------------------------------
"exact" = holds for every single estimate; "expect." = holds in expectation over seeds only;
"no" = does not hold. Efficiency: values sum to ``nu(N) - nu(empty)``.

====================  ==============================  ===========  ========  ===========  ========
method                estimates                       efficiency   symmetry  null player  unbiased
====================  ==============================  ===========  ========  ===========  ========
exact                 Shapley value (2^n coalitions)  exact        exact     exact        (exact)
owen                  Shapley value (Owen integral)   exact [1]    expect.   exact        yes [2]
owen-antithetic       Shapley value, antithetic pair  exact [1]    expect.   exact        yes [8]
owen-paper            Paper's Alg. 1 (fixed q grid)   no           expect.   exact        no
mc-shapley            Shapley value (permutations)    exact        expect.   exact        yes
gtg-shapley           Shapley value, truncated        ~ [3]        expect.   exact        no [3]
gtg-greedyfed         the same, GreedyFed's stopping  ~ [3]        expect.   exact [10]   no [3]
banzhaf               Banzhaf value (MSR)             no           expect.   expect.      yes [4]
weighted-shap         Beta(alpha, beta) semivalue     no [5]       expect.   exact        yes [4]
loo                   leave-one-out                   no           exact     exact        (exact)
svarm                 Shapley value (size strata)     no           expect.   expect.      yes [6]
kernel-shap           Shapley value (regression)      exact [7]    expect.   expect.      no [7]
leverage-shap         Shapley value (regression)      exact [7]    expect.   expect.      no [7]
kadd-shap             Shapley of a 2-additive fit     exact [7]    expect.   expect.      no [7]
first-order           first-order terms (1 gradient)  no           [9]       exact        no [9]
first-order-refined   Simpson first-order + walks     no           expect.   exact        no [11]
first-order-simpson   Simpson's rule (3 gradients)    no           [9]       exact        no [11]
====================  ==============================  ===========  ========  ===========  ========

[1] walk sampler (default): every walk telescopes to ``nu(N) - nu(empty)``; with ``eta > 0`` a
    truncated walk loses less than ``eta`` of the gain. The flip sampler is efficient only in
    expectation. [2] with ``eta = 0`` (default); every marginal is an unbiased draw, and
    re-spending cache savings leaves no measurable bias (docs/valuation.md). [3] the walk is
    cut once ``|nu(N) - nu(prefix)| < eps``: up to ``eps`` of the gain is dropped per walk.
    [4] unbiased for its own value (Banzhaf / Beta semivalue), not for the Shapley value.
    [5] efficient only for ``alpha = beta = 1`` (then it is the Shapley value).
    [6] once its covering warm-up fits the budget (n = 10: 62 evaluations, i.e. M >= 7; checked
    by tests/test_valuation_accuracy.py); below that a stratum can be empty and is imputed
    (biased). [7] the regression is constrained to ``nu(N) - nu(empty)``; exact values at a
    budget of 2^n (every size enumerated); at smaller budgets a ratio of random quantities
    (300-seed checks flag a small bias on the FedAvg game). ``kadd-shap`` is exact for any
    game with at most pairwise interactions, ``kernel-shap`` too (paired sampling).
[8] ``owen`` with ``antithetic=True``: each walk paired with its reverse, whose average is exact
    for any game with at most pairwise interactions (only third and higher order terms leave
    variance); needs ``2n`` evaluations for one pair.
[9] ``phi_i = c_i(at)``, the utility's first-order term (``utility.first_order(at)``, one
    backward pass for the torch utility; :mod:`~fedowen_strategy.valuation.first_order`):
    deterministic, exact for additive games and, at the default midpoint ``at = 0.5``, for
    games whose smooth extension is quadratic; biased by the third and higher order terms.
    Symmetric players get equal values when the extension is symmetric in them too (equal
    weighted updates in the delta game).
[10] ``gtg-greedyfed`` (:mod:`~fedowen_strategy.valuation.gtg`): GTG-Shapley's sweeps, both
    truncations at ``eps = 1e-4`` and GreedyFed's convergence rule (about 20 permutations);
    a round whose gain ``|nu(N) - nu(empty)|`` is below ``eps`` is not valued and every player,
    a null player too, gets ``1e-9``.
[11] ``first-order-refined`` (:mod:`~fedowen_strategy.valuation.refined`): Simpson's rule
    over the first-order terms at 0, 1/2 and 1 (three gradients) for every player, then
    antithetic Owen walks only for the players whose bands (``band`` x the terms' second
    difference) overlap another's; exact for additive and quadratic games; biased for the
    settled players; symmetric players are refined alike in expectation (random tie order).
    ``first-order-simpson`` is its step 1 alone (``band = 0``: no walks, deterministic).

References: Owen (1972); Okhrati and Lipani (2021); Castro et al. (2009); Liu et al. (2022,
GTG-Shapley); Singhal et al. (2024, GreedyFed); Wang and Jia (2023, Data Banzhaf); Kwon and
Zou (2022, Beta Shapley / WeightedSHAP); Kolpaczki et al. (2024, Stratified SVARM); Lundberg
and Lee (2017) and Covert and Lee (2021, KernelSHAP); Musco and Witter (2025, Leverage SHAP);
Pelegrina et al. (2023, kADD-SHAP). See docs/valuation.md for the benchmarks
(docs/valuation-reference.md for the reference games).
"""

from __future__ import annotations

from fedowen_strategy.valuation._base import FLAT, Valuation
from fedowen_strategy.valuation.registry import (
    ESTIMATORS,
    EstimatorSpec,
    estimate,
    estimate_problems,
)

__all__ = ["ESTIMATORS", "FLAT", "EstimatorSpec", "Valuation", "estimate", "estimate_problems"]
