"""The provider tests' fixtures, for the dialects' tests over provider routes."""

from __future__ import annotations

from ...providers.conftest import providers

__all__ = ["providers"]
