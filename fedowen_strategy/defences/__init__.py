"""What stands between a reply and the average: the update guards (:mod:`.guards`: norm
ratio, bounds, norm and value caps, copies, filters), the identity cap and Sybil links, the
majority and server-direction filters, the robust learning rate.

Each module is a set of pure functions over update vectors (:mod:`fedowen_strategy.updates`)
and replies (:mod:`fedowen_strategy.replies`); :class:`.guard_settings.Guards` holds their settings.
"""
