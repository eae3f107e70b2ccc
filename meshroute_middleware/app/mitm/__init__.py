"""The mitmproxy addon: route chat requests passing through mitmproxy with meshroute's Router.

`mitmdump -s meshroute_middleware/app/mitm/addon.py --set meshroute_nodes_file=nodes.json`.
Needs the `mitm` extra (mitmproxy 11.0.2), in a venv of its own: `scripts/mitm-venv`.
`MeshRouteAddon` is imported on first use, so that `mitm.options` (which needs no mitmproxy)
can be read where mitmproxy is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshroute_middleware.app.mitm.proxy import MeshRouteAddon

__all__ = ["MeshRouteAddon"]


def __getattr__(name: str) -> Any:
    if name == "MeshRouteAddon":
        from meshroute_middleware.app.mitm.proxy import MeshRouteAddon

        return MeshRouteAddon
    raise AttributeError(name)
