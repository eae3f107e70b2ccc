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


class ModelGoneError(NoRouteError, UnknownModelError):
    """Every node of a model that had nodes left: known, not served now (HTTP 503, not the
    404 of a model never seen). Still an UnknownModelError for an adapter that lets another
    server answer a model the mesh does not serve (annotate mode, the mitmproxy addon)."""
