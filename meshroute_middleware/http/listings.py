"""The documents the gateway API lists: provider routes as /v1/models entries, a name a
request may use though no listing shows it, and the embeddings part of /v1/routing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshroute_middleware.core import Router
from meshroute_middleware.core.capabilities import CAPABILITIES
from meshroute_middleware.core.providers.config import ProvidersConfig
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import AUTO_ALIASES
from meshroute_middleware.http.inference import NEEDS

__all__ = ["embeddings_table", "provider_models", "routable_model", "script_safe_json"]


def script_safe_json(doc: bytes) -> str:
    """JSON text to place inside a <script> element: `<`, `>` and `&` (which occur only in
    its strings) \\u-escaped, so no "</script>" or "<!--" in a value ends the element."""
    return (doc.decode().replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))


def provider_models(cfg: ProvidersConfig) -> list[dict[str, Any]]:
    """/v1/models entries of the provider tables: chains first, then provider models."""
    chains: list[tuple[str, tuple[str, ...], str]] = []
    active = cfg.profile(cfg.routing.profile) if cfg.routing.profile else None
    auto = active.chain if active is not None else cfg.routing.chain
    if auto:
        chains.append(("auto", auto, (active.strategy if active else None)
                       or cfg.routing.strategy))
    chains += [(f"auto:{p.name}", p.chain, p.strategy or cfg.routing.strategy)
               for p in cfg.profiles]
    data: list[dict[str, Any]] = [
        {"id": name, "object": "model", "owned_by": "meshroute", "kind": "chain",
         "chain": list(chain), "strategy": strategy} for name, chain, strategy in chains]
    data += [{"id": f"{p.name}/{m.id}", "object": "model", "owned_by": p.name,
              "kind": "provider", "tier": m.tier, "context": m.context,
              "capabilities": [c for c in CAPABILITIES if c in m.capabilities]}
             for p in cfg.providers for m in p.models]
    data += [{"id": a.pattern, "object": "model", "owned_by": "meshroute", "kind": "alias",
              "target": a.target, "pattern": a.is_glob} for a in cfg.aliases.entries]
    return data


def routable_model(cfg: ProvidersConfig, model: str) -> dict[str, Any] | None:
    """The model object of a name /v1/models does not list but a request may use: one an
    alias pattern matches, or an `auto:<strategy>`."""
    target = cfg.aliases.resolve(model)
    if target is not None:
        return {"id": model, "object": "model", "owned_by": "meshroute", "kind": "alias",
                "target": target}
    strategy = AUTO_ALIASES.get(model[5:]) if model.startswith("auto:") else None
    if strategy is not None:
        return {"id": model, "object": "model", "owned_by": "meshroute", "kind": "chain",
                "strategy": strategy}
    return None


def embeddings_table(router: Router, model: str | None,
                     providers: ProviderRouter | None = None,
                     flying: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The embeddings statistics of the models with embeddings traffic, over their routes
    that declare `embeddings`: `tps` there is inputs per second (also as `inputs_per_s`),
    `ttfb_ms` the whole answer's latency (also as `latency_ms`: it comes in one piece). A
    route's `in_flight` is the whole gateway's when `flying` counts every worker's."""
    out: dict[str, Any] = {}
    flying = flying or {}
    # only the models embeddings were sent to (or go to now): a table per model costs (shares
    # are sampled)
    busy = {**router.own_in_flight(), **flying}
    measured = ({key[0] for key, _ in router.stats}
                | {sig.partition("|")[0] for sig, n in busy.items() if n}
                if model is None else {model})
    for name in sorted(m for m in measured if router.topology.model(m) is not None):
        entry = router.routing_table(name)["models"][name]
        capable = {r.signature for r in router.candidates(name, NEEDS["embeddings"])}
        rows = [r for r in entry["candidates"] if r["signature"] in capable]
        for row in rows:
            row["in_flight"] = max(row["in_flight"], flying.get(row["signature"], 0))
        if not any(r["successes"] or r["failures"] or r["in_flight"] for r in rows):
            continue  # no embeddings traffic: chat's table says all there is
        total = sum(r["share"] for r in rows)
        for row in rows:
            row["inputs_per_s"], row["latency_ms"] = row["tps"], row["ttfb_ms"]
            row["share"] = row["share"] / total if total > 0 else 0.0
        out[name] = {**entry, "candidates": rows}
    table: dict[str, Any] = {"unit": "inputs_per_s", "models": out}
    if providers is not None and model is None:  # provider routes: by route, as measured
        table["providers"] = {
            route: {"inputs_per_s": st.tokens_per_s, "latency_ms": st.ttfb_ms,
                    "successes": st.ok, "failures": st.fail}
            for route, st in sorted(providers.stats.items())}
    return table
