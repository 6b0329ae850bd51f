"""fedowen_strategy/valuation."""
