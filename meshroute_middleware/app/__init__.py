"""The composition layer: the `meshroute` command and what it builds.

The only modules that import `gossip/` and `node_agent/`; the adapters sit beneath (the
middleware, forwarding, the tracker's endpoints, telemetry) and the core beneath them.
`.ci/run` enforces the layers with import-linter (see docs/architecture.md).
"""
