"""The studies: one folder each, over the harness in :mod:`sim` (which imports none of them).

A study holds its modules (analyses, command lines, the pages they write) and the report
sections it adds to a preset's report; ``pyproject.toml``'s ``[tool.fedowen.report]`` names
those sections by ``module:function`` and :mod:`sim.sections` imports them by that name. Its
presets stay in ``conf/`` (their paths are quoted in every committed report and archive
manifest); each folder's ``__init__`` names them.

- :mod:`studies.ablation`: ``ablation`` grids paired against their reference (every preset that
  has them), and the first ablation's size check;
- :mod:`studies.adversarial`: ``adversarial`` grids, attack costs and Sybil links (the arena);
- :mod:`studies.backdoor`: attack success and the backdoor development rule (issue 45);
- :mod:`studies.selection`: the selection development rule and writer coverage (issue 43);
- :mod:`studies.confirmation`: the pre-registered confirmations, their ``tuning`` grids and the
  second one's picks (issues 28, 46 and 60).
"""
