"""Selection development (issues 43 and 62): which selector FedOwen adopts, read from its cells.

- :mod:`.development`: the development grid's rule (``python -m studies.selection.development``);
- :mod:`.peers`: the peers' development grid (GreedyFed, DELTA, HiCS-FL, the candidates
  hics-phi and delta-phi) against selection-dev's arms, its rule and report
  (``python -m studies.selection.peers``; :mod:`.peers_data` reads the cells and checks
  the anchor, :mod:`.peers_rule` the rule's steps, :mod:`.peers_report` and
  :mod:`.peers_markdown` its files);
- :mod:`.incumbent`: a challenger against the incumbent default, paired by seed (issue 73:
  hics-phi against Algorithm 2, ``python -m studies.selection.incumbent``);
- :mod:`.replay`: a preset's archived cells replayed at this checkout, round by round (issue
  73: one hics-phi cell per setting of selection-peers-dev, ``python -m studies.selection.replay``);
- :mod:`.writer_coverage`: writers a selector favours or neglects on FEMNIST
  (``python -m studies.selection.writer_coverage``);
- :mod:`.cells`: what these read off one finished cell (scores, distinct clients, costs).

Presets: ``conf/selection-dev.toml``, ``conf/selection-peers-dev.toml``. Pages:
``docs/selection.md``, ``docs/results/selection-dev/selection.md``,
``docs/results/selection-peers-dev/selection.md``.
"""
