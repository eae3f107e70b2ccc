"""app.bench."""
