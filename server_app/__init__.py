"""server_app."""
