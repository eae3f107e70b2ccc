"""forwarding."""
