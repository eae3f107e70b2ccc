"""`meshroute demo`: a whole emulated mesh on this machine, learning live.

Starts emulated shard nodes of two models and a tracker gateway on 127.0.0.1; the nodes
announce themselves over mDNS on loopback (or register over HTTP), chat traffic flows through
the gateway, and a view refreshed in place shows what the router learns. The mesh lives: a
node leaves, another joins, the best node slows down; each is announced as it happens. Ctrl-C
(or the end of `--seconds`) stops it quietly with a summary line.
"""

from __future__ import annotations

from meshroute_middleware.app.demo.driver import add_arguments, run

__all__ = ["add_arguments", "run"]
