"""The script mitmproxy loads: `mitmdump -s <path to this file> --set meshroute_nodes_file=…`.

The one place the addon meets the process environment (MESHROUTE_* variables, as for
`meshroute serve`).
"""

import os

from meshroute_middleware.app.mitm import MeshRouteAddon

addons = [MeshRouteAddon(environ=os.environ)]
