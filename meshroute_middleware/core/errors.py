"""Errors of the routing core; adapters map them to HTTP answers at the boundary."""

from __future__ import annotations


class MeshRouteError(Exception):
    """Base of every error meshroute raises on purpose."""


class InvalidNodeError(MeshRouteError, ValueError):
    """A node record is malformed or out of range; the message says which field and why."""


class UnknownModelError(MeshRouteError, LookupError):
    """No node or provider serves the requested model."""


class InvalidPinError(MeshRouteError, ValueError):
    """A pinned route names an unknown node or does not cover the model contiguously."""


class NoRouteError(MeshRouteError):
    """The model is known but no candidate route can serve it; `reasons` says why, per route."""

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.reasons: dict[str, str] = dict(reasons or {})
