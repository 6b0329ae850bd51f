"""Backdoors (issue 45): attack success per arm and the development rule's reading.

- :mod:`.attack_success`: the report section after the grids where a backdoor ran, and the same
  files alone (``python -m studies.backdoor.attack_success``).

Presets: ``conf/backdoor-dev.toml``, ``backdoor-dev2``, ``backdoor-dev3``, ``backdoor-dev4``,
``backdoor-fresh``. Pages: ``docs/results/backdoor-*/attack-success.md``.
"""
