"""Selection development (issue 43): which selector FedOwen adopts, read from its cells.

- :mod:`.development`: the development grid's rule (``python -m studies.selection.development``);
- :mod:`.writer_coverage`: writers a selector favours or neglects on FEMNIST
  (``python -m studies.selection.writer_coverage``).

Preset: ``conf/selection-dev.toml``. Pages: ``docs/selection.md``,
``docs/results/selection-dev/selection.md``.
"""
