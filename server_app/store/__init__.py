"""The ServerApp's store: what a run writes and reads back in its output dir.

``records`` (``rounds.jsonl``, ``ledger.csv``, JSON files, written atomically),
``checkpoint`` (``checkpoint.npz``: the global model and the strategy's state, with the run
config's hash) and ``payouts`` (``payouts.csv`` from the records). The strategy library does
no file I/O: FedOwen hands each round's record to a hook, which the ServerApp points here.
"""
