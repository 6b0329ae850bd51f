"""The experiments' harness: presets and their grids of cells, the resumable runner and its
backends (``flwr run``, inline, a Ray cluster), the cells' records and archives, the report's
skeleton with its section table (:mod:`sim.sections`), and the statistics over seeds. It names
no study: a study's modules and report sections live in a folder of their own beside it."""
