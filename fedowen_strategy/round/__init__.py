"""One round's pipeline: returned replies -> :mod:`.round_step` (guards, valuation,
aggregation) -> :mod:`.contribution` (phi and the settings that value it, through
:mod:`.round_valuers`) -> :mod:`.aggregation` (the weights and the average) ->
:mod:`.round_record` (what the round writes).
"""
