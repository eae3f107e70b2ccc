"""Which routes a request's `model` may use (issue 12), before any scoring.

`resolve` turns a request's model into a strategy and candidate routes:
- a mesh model (one the topology serves now): that model alone;
- `<provider>/<model id>`: that provider model alone (a configured provider name wins over a
  mesh model spelled the same way);
- `auto`: the active profile's chain, else the global `[routing] chain`;
- `auto:fast|fastest|speed|smart|smartest|reliable|balanced|cheap|cheapest|priority`: every
  provider model and every mesh model, ranked by that strategy (`priority`: in the config
  file's order, providers and their models as written, then the mesh models by name);
- `auto:<profile>`: that profile's chain.
A profile named inside a chain stands for its own chain's entries there (`expand_chain`).
An unknown `auto:*` raises InvalidModelError (HTTP 400 `invalid_model`); an unknown model
UnknownModelError (404). Also here: pinning and session stickiness, which reorder a ranking.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..errors import MeshRouteError, UnknownModelError
from .config import NO_MESH_LIMITS, MeshLimits, Profile, Provider, ProviderModel, ProvidersConfig
from .scoring import AUTO_ALIASES

SESSION_TTL_S = 3600.0  # a session forgets its route after an hour of silence
SESSION_MAX = 10_000  # sessions remembered at most (least recently used dropped first)
# issue 22: 3,000 requests with 60 KB ids added 172 MB; ids are capped at the HTTP edge
# (http/request.py, 400) and here, and the whole map in bytes of ids and routes.
MAX_SESSION_ID_BYTES = 128
SESSION_HEADER = "x-session-id"  # a conversation's id, sent by the client (issue 26)
SESSION_MAX_BYTES = 4 * 1024 * 1024


class InvalidModelError(MeshRouteError, ValueError):
    """An `auto:*` model names no strategy alias and no profile (HTTP 400 `invalid_model`)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A route a request may take: a provider model (over its keys) or a mesh model."""

    route: str  # "fastco/big-model" or the mesh model's name
    tier: str
    provider: Provider | None = None
    model: ProviderModel | None = None
    size: MeshLimits = NO_MESH_LIMITS  # a mesh model's `[mesh.MODEL]` context and max_tokens

    @property
    def is_provider(self) -> bool:
        return self.provider is not None

    @property
    def context(self) -> int | None:
        return self.model.context if self.model else None

    @property
    def upstream_model(self) -> str:
        """The model id the upstream must receive (`big-model`, or the mesh model)."""
        return self.model.id if self.model else self.route


@dataclass(frozen=True, slots=True)
class Resolution:
    """A request's model resolved: the strategy to rank by and the candidates, in chain order."""

    model: str
    strategy: str
    candidates: tuple[Candidate, ...]
    missing: tuple[str, ...] = ()  # chain entries naming mesh models no node serves now


def resolve(cfg: ProvidersConfig, model: str, mesh_models: Collection[str]) -> Resolution:
    """The strategy and candidate routes for a request's `model`; raises for unknown names."""
    if model.startswith("auto:"):
        name = model[5:]
        if name in AUTO_ALIASES:
            everything = [provider_candidate(p, m) for p in cfg.providers for m in p.models]
            everything += [mesh_candidate(cfg, m) for m in sorted(mesh_models)]
            return Resolution(model, AUTO_ALIASES[name], tuple(everything))
        profile = cfg.profile(name)
        if profile is None:
            raise InvalidModelError(f"unknown model alias {model!r}: not one of "
                                    f"auto:{{{','.join(sorted(AUTO_ALIASES))}}} and no profile "
                                    f"named {name!r}")
        return _from_chain(cfg, model, expand_chain(cfg, profile.chain, mesh_models, (name,)),
                           _strategy(cfg, profile), mesh_models)
    if model == "auto":
        active = cfg.profile(cfg.routing.profile) if cfg.routing.profile else None
        chain = (expand_chain(cfg, active.chain, mesh_models, (active.name,)) if active
                 else expand_chain(cfg, cfg.routing.chain, mesh_models))
        return _from_chain(cfg, model, chain, _strategy(cfg, active), mesh_models)
    if cfg.names_provider(model):
        pair = cfg.split_route(model)
        if pair is None:
            raise UnknownModelError(f"provider {model.partition('/')[0]!r} has no model "
                                    f"{model.partition('/')[2]!r}")
        return Resolution(model, cfg.routing.strategy, (provider_candidate(*pair),))
    if model in mesh_models:
        return Resolution(model, cfg.routing.strategy, (mesh_candidate(cfg, model),))
    raise UnknownModelError(f"no provider or mesh node serves model {model!r}")


def provider_candidate(provider: Provider, model: ProviderModel) -> Candidate:
    return Candidate(f"{provider.name}/{model.id}", model.tier, provider, model)


def mesh_candidate(cfg: ProvidersConfig, model: str) -> Candidate:
    return Candidate(model, cfg.mesh_tier(model), size=cfg.mesh_size(model))


@dataclass(frozen=True, slots=True)
class Fit:
    """Whether a request fits a mesh route's declared size (issue 33), and the `max_tokens`
    it is served with when the route clamps it (None: as asked)."""

    fits: bool
    max_tokens: int | None = None


FITS = Fit(True)
TOO_BIG = Fit(False)


def mesh_fit(c: Candidate, prompt: int, asked: int | None) -> Fit:
    """How a request of `prompt` tokens (estimated) asking for at most `asked` answer tokens
    fits candidate `c`'s `[mesh.MODEL]` limits: as it is; with `max_tokens` lowered to the
    room left (the model's `max_tokens`, and its `context` less the prompt) when the model
    clamps; or not at all, to be passed over for a route that fits. A provider model's
    context is the key gates' business (ProviderRouter.admit)."""
    size = c.size
    if c.is_provider or size is NO_MESH_LIMITS:
        return FITS
    if size.context is not None and prompt >= size.context:
        return TOO_BIG  # no answer fits beside the prompt
    rooms = [r for r in (size.max_tokens,
                         None if size.context is None else size.context - prompt)
             if r is not None]
    room = min(rooms) if rooms else None
    if asked is None or room is None or asked <= room:
        return FITS
    return Fit(True, room) if size.clamp else TOO_BIG


def _strategy(cfg: ProvidersConfig, profile: Profile | None) -> str:
    return profile.strategy if profile and profile.strategy else cfg.routing.strategy


def expand_chain(cfg: ProvidersConfig, chain: Sequence[str], mesh_models: Collection[str],
                 within: tuple[str, ...] = ()) -> list[str]:
    """A chain's entries with each profile it names replaced by that profile's own chain, in
    its place (issue 33: a chain entry may name a profile), each entry once where it first
    comes. A provider model or a mesh model (declared, or served now) of the same name wins
    over a profile; a profile being expanded already (`within`: a cycle) adds nothing."""
    out: list[str] = []
    for entry in chain:
        profile = (None if cfg.split_route(entry) is not None or entry in cfg.mesh_limits
                   or entry in mesh_models else cfg.profile(entry))
        if profile is None:
            parts = [entry]
        elif profile.name in within:
            parts = []
        else:
            parts = expand_chain(cfg, profile.chain, mesh_models, (*within, profile.name))
        for part in parts:
            if part not in out:
                out.append(part)
    return out


def _from_chain(cfg: ProvidersConfig, model: str, chain: Sequence[str], strategy: str,
                mesh_models: Collection[str]) -> Resolution:
    found: list[Candidate] = []
    missing: list[str] = []
    for entry in chain:
        pair = cfg.split_route(entry)
        if pair is not None:
            found.append(provider_candidate(*pair))
        elif entry in mesh_models:
            found.append(mesh_candidate(cfg, entry))
        else:
            missing.append(entry)
    return Resolution(model, strategy, tuple(found), tuple(missing))


class Sessions:
    """`x-session-id` → the route that last served it; bounded in entries, bytes and time."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, max_entries: int = SESSION_MAX,
                 max_bytes: int = SESSION_MAX_BYTES) -> None:
        self.ttl_s, self.max_entries, self.max_bytes = ttl_s, max_entries, max_bytes
        self._routes: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.bytes = 0  # of the ids and routes held

    def get(self, session: str | None, now: float) -> str | None:
        if session is None or session not in self._routes:
            return None
        route, at = self._routes[session]
        if now - at > self.ttl_s:
            self.forget(session)
            return None
        return route

    def served(self, session: str | None, route: str, now: float) -> None:
        if session is None or len(session.encode("utf-8", "replace")) > MAX_SESSION_ID_BYTES:
            return  # a longer id is refused at the edge; never held here either
        self.forget(session)
        self._routes[session] = (route, now)
        self.bytes += _size(session, route)
        while len(self._routes) > self.max_entries or self.bytes > self.max_bytes:
            old, (old_route, _) = self._routes.popitem(last=False)
            self.bytes -= _size(old, old_route)

    def forget(self, session: str | None) -> None:
        if session is not None:
            held = self._routes.pop(session, None)
            if held is not None:
                self.bytes -= _size(session, held[0])

    def __len__(self) -> int:
        return len(self._routes)


def _size(session: str, route: str) -> int:
    """What one remembered session costs, as counted against `max_bytes`."""
    return len(session.encode("utf-8", "replace")) + len(route.encode("utf-8", "replace"))
