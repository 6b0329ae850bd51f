"""What a deployment runs besides Flower: the Fleet gateway (Docker), the local SuperLink
launcher and ``flwr run`` driver (``scripts/run.sh``), the loopback TLS rehearsal of
docs/deployment.md, and the process helpers they share. Production code: ``sim`` (the
experiments) uses it, it uses nothing of ``sim``."""
