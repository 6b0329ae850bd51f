"""Simulated adversaries (simulation only): one room for every attack, both sides.

A seeded fraction of the partitions (``adversary-fraction``; who is a pure function of the
partition count, the fraction and the seed, :func:`~fedowen_task.adversary.keys.
adversary_ids`, so the clients, the ServerApp and the reports name the same ones) misbehaves
as ``adversary-kind`` says. Every kind is one row of the table
(:data:`fedowen_task.adversary.attacks.ATTACKS`):

- ``label-flip``: trains honestly on labels mapped ``y -> C - 1 - y`` (a poisoned update);
- ``noise``: returns the global model plus i.i.d. Gaussian noise of std
  ``adversary-noise-std`` instead of a trained update (a random update);
- ``free-rider``: returns the global model unchanged while claiming its examples (no work);
- ``sybil``: one actor behind many identities: every adversary trains on the data of the
  group's first partition with that partition's seed, so whenever two of them are selected in
  one round they return copies of one update (each under its own client id);
- ``disguised-free-rider`` (Fraboni et al., AISTATS 2021): returns the global model plus
  Gaussian noise whose norm equals an honest update's. The client trains honestly only to
  *measure* that norm (the strongest disguise: a real free rider must guess it, e.g. from the
  last global update) and reports its honest training loss, then discards the training;
- ``replay-free-rider`` (ibid.): returns ``global_t + (global_t - global_s) / (t - s)``,
  ``s`` being the last round it was sent a model (kept in its context state): the last global
  update it saw, per round. It does no training; in the first round it takes part it has no
  earlier model and returns the global model unchanged (a plain free rider);
- ``colluding-sybil``: as ``sybil`` (one actor's update), but every copy adds Gaussian noise
  of norm ``adversary-sybil-noise`` x the update's norm, seeded by the copy's own client id,
  so copies are not exact duplicates (0.1 puts two copies about 0.14 x the norm apart,
  far beyond ``duplicate-tolerance``, default 1e-6);
- ``boosted``: trains honestly and scales its update by ``adversary-boost``. It is meant to
  sit just under the bound in force, but a client cannot know the others' norms: FedOwen's
  ``update-bound`` allows 3 x the round's lower-median norm *per example* x n_i, so a client
  whose own norm per example is typical passes with any factor below 3. The default 2.5
  leaves room for a client 20% above the median (measured honest per-example norms spread
  2.2x, :mod:`fedowen_strategy.defences.bounds`);
- ``sign-flip``: trains honestly and returns ``global - (trained - global)``: the honest
  update reversed (the sign-flipping attack of Byzantine-robustness benchmarks such as
  Blades and ByzFL);
- ``huge-statistics``: trains honestly and sends its parameters as trained, but every
  BatchNorm running variance 1e6 and every running mean 1e3 (valid: finite, non-negative; a
  model without normalisation statistics sends its honest update);
- ``scaled-statistics``: trains honestly and multiplies its running variances and means by
  ``adversary-statistics-scale`` (default 4): the subtler statistics attack;
- ``backdoor``, ``dba``, ``neurotoxin``, ``adaptive-backdoor``: backdoors (a trigger stamped
  on a share of the attacker's images, relabelled to the target; every round records the
  attack success, :mod:`~fedowen_task.adversary.backdoor`): the plain one boosted; DBA's
  (Xie et al., ICLR 2020), each attacker planting one bar of the ``bars`` pattern; Neurotoxin
  (Zhang et al., ICML 2022), its local steps kept off the coordinates the last global change
  used most (:mod:`~fedowen_task.adversary.neurotoxin`); and one shaped by the ServerApp to
  pass the defaults (direction on the honest cone, norm just under the bound);
- ``alie``, ``ipm``, ``adaptive``: omniscient attacks that need the round's honest updates
  ("a little is enough", Baruch et al., NeurIPS 2019; inner-product manipulation, Xie et al.,
  UAI 2020; an adaptive booster that sits just under the defence's bound). Their clients
  train and reply as honest ones; the ServerApp replaces their replies at the message
  boundary (``server_app.byzantine``, with :mod:`fedowen_task.adversary.server`), so the
  attacks act the same under every strategy and backend.

The rooms: :mod:`~fedowen_task.adversary.keys` (the ``adversary-*`` run-config keys and the
frozen :class:`~fedowen_task.adversary.keys.AdversaryConfig`; no torch),
:mod:`~fedowen_task.adversary.attacks` (the table), :mod:`~fedowen_task.adversary.client`
(the ClientApp's side, torch), :mod:`~fedowen_task.adversary.server` (the ServerApp's,
numpy), and beside them :mod:`~fedowen_task.adversary.backdoor` (triggers and attack success)
and :mod:`~fedowen_task.adversary.neurotoxin` (its mask and masked steps).
"""
