"""Ablations: each variant against a reference, paired by seed.

- :mod:`.report`: the report sections of ``ablation`` grids (one per grid) and the overview
  before the grids where two or more share their rows (``[tool.fedowen.report]``);
- :mod:`.data`: an ablation grid's cells as data, its plots and CSVs;
- :mod:`.selection_sizes`: do a sweep's selections favour clients with more examples
  (``python -m studies.ablation.selection_sizes``).

Presets: ``conf/ablation-mnist.toml`` and ``conf/fltrust-tune-mnist.toml``; most presets since
have ablation grids (the arena, backdoor, selection and confirmation presets). Pages:
``docs/report.md``, ``docs/results/ablation-mnist/``.
"""
