"""Every error the project defines derives from MeshRouteError (one base, specific
subclasses), and each maps to its HTTP answer through the one table."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import gossip
import meshroute_middleware
import node_agent
from meshroute_middleware.core import InvalidPinError, MeshRouteError, NoRouteError
from meshroute_middleware.http.errors import (
    INTERNAL_ERROR,
    DeadlineExceeded,
    ErrorAnswer,
    RequestError,
    RoutesFailed,
    RoutesRateLimited,
)


def project_modules() -> list[str]:
    names = []
    for package in (meshroute_middleware, gossip, node_agent):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if ".app.mitm" not in info.name and not info.name.endswith("__main__"):
                names.append(info.name)  # the addon needs mitmproxy's own venv
    return names


@pytest.mark.parametrize("name", project_modules())
def test_every_error_class_derives_from_meshrouteerror(name: str) -> None:
    module = importlib.import_module(name)
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == name and issubclass(cls, BaseException):
            assert issubclass(cls, MeshRouteError), f"{name}.{cls.__name__}"


@pytest.mark.parametrize(("exc", "status", "type_", "code"), [
    (RequestError(413, "too big", "request_too_large"), 413, "invalid_request_error",
     "request_too_large"),
    (InvalidPinError("gap"), 400, "invalid_request_error", "invalid_route"),
    (NoRouteError("none", {"m|a": "down"}), 503, "server_error", "no_route_available"),
    (RoutesFailed("failed", {}), 503, "server_error", "no_route_available"),
    (RoutesRateLimited("limited", {}), 429, "rate_limit_error", "rate_limited"),
    (DeadlineExceeded("late", {}), 504, "server_error", "request_timeout"),
    (KeyError("a bug"), 500, "server_error", "internal_error"),
])
def test_the_error_table(exc: BaseException, status: int, type_: str, code: str) -> None:
    answer = ErrorAnswer.of(exc)
    assert (answer.status, answer.type, answer.code) == (status, type_, code)
    if status == 500:
        assert answer is INTERNAL_ERROR  # a bug's message is never the exception's text
