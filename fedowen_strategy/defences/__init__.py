"""What stands between a reply and the average: an ordered list of defences (issue 72).

One protocol (:mod:`.base`: a :class:`~.base.Guard` acts on the reply messages, the decoded
updates or the aggregate), one module per defence (``identity``, ``norm_ratio``,
``update_bound``, ``update_filter``, ``norm_cap``, ``statistics_cap``, ``value_cap``,
``sybil_links``, ``statistics_rule``, ``robust_lr``, ``noise``) and one table of them
(:mod:`.table`: ``DEFENCES``, the run config's ``defences`` and its ``auto`` lists), applied
inside FedOwen's round (:mod:`.guards`, :mod:`fedowen_strategy.round.round_step`) or around any
Flower strategy (:mod:`.defended`). Beneath them, pure functions over update vectors
(:mod:`fedowen_strategy.updates`) and replies (:mod:`fedowen_strategy.replies`): bounds, links,
the majority and server-direction filters, the statistics rule, the sign vote;
:class:`.guard_settings.Guards` holds their settings. docs/defences.md: how to add one.
"""
