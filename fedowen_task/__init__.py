"""fedowen_task."""
