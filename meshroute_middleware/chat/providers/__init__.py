"""A provider chain in the chat path: the chain loop (`chain`), a provider key attempt
(`call`), a mesh entry (`mesh_entry`), their outcomes (`outcomes`), the per-request state
(`request`), the `x-meshroute-*` tally (`tally`) and key scrubbing (`scrub`)."""

from meshroute_middleware.chat.providers.chain import ProviderChat
from meshroute_middleware.chat.providers.tally import with_tried

__all__ = ["ProviderChat", "with_tried"]
