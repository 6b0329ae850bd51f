"""The pre-registered confirmations (issues 28, 46 and 60).

- :mod:`.pages`: ``docs/confirmation.md`` and ``docs/confirmation2.md`` from the committed CSVs,
  the protocol's arms and the cells' check (``python -m studies.confirmation.pages``);
- :mod:`.protocol`, :mod:`.hypotheses`, :mod:`.robustness`, :mod:`.collapse`, :mod:`.tables`:
  the protocol's fixed points, its tests, the seed-omission check, the collapse marker and the
  pages' tables;
- :mod:`.tuning`: the report sections of ``tuning`` grids and, after the grids, the second
  confirmation's better-of picks;
- :mod:`.picks`: the second confirmation's picks (``python -m studies.confirmation.picks``).

Presets: ``conf/confirm/<dataset>.toml`` and ``conf/confirm2/<dataset>.toml``. Protocols:
``docs/confirmation/PROTOCOL.md``, ``docs/confirmation2/PROTOCOL.md`` (they quote the commands
as ``python -m sim.confirmation`` and ``python -m sim.confirm2_picks``, their names when the
protocols were registered; today's are above).
"""
