"""The mitmproxy addon: route chat requests passing through mitmproxy with meshroute's Router.

`mitmdump -s meshroute_middleware/mitm/addon.py --set meshroute_nodes_file=nodes.json`.
Needs the `mitm` extra (mitmproxy 11.0.2), in a venv of its own: `scripts/mitm-venv`.
"""

from .proxy import MeshRouteAddon

__all__ = ["MeshRouteAddon"]
