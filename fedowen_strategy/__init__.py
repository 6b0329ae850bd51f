"""fedowen_strategy."""
