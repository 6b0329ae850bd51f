"""client_app."""
