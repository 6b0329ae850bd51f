"""Adversarial clients and the defences against them (the arena).

- :mod:`.report`: the report section after the grids over every ``adversarial`` grid (accuracy
  under attack, the adversaries' phi ranks, shares of selection and weight, the payout ledger);
- :mod:`.adversary_stats`: what adversaries get in a cell's records;
- :mod:`.attack_costs`: what each attack costs each defence, paired against its clean run
  (``python -m studies.adversarial.attack_costs``);
- :mod:`.sybil_links`: the honest pairs' cosines, false links and caught copies
  (``python -m studies.adversarial.sybil_links``).

Presets: ``conf/adversarial-mnist.toml``, ``arena-mnist``, ``arena2-mnist``, ``fair-game-mnist``,
``sybil-mnist``, ``sybil-memory-dev``, ``booster-dev-mnist``, ``booster-dev2-mnist``,
``defaults-dev-mnist``, ``defaults-fresh``, ``defaults-next-fresh``, ``phi-scale-adversarial``.
Page: ``docs/arena.md``.
"""
