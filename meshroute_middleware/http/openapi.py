"""The gateway's OpenAPI 3.0 document (`GET /openapi.json`), written by hand: every endpoint
of `api.GatewayAPI` and the routed paths (chat, embeddings, completions), error bodies
included. `tests/http/test_openapi.py`
checks that it lists every route, and runs schemathesis against a live gateway with it."""

from __future__ import annotations

from typing import Any

from meshroute_middleware.core.cache_prior import MAX_CACHE_TOKENS
from meshroute_middleware.core.capabilities import CAPABILITIES
from meshroute_middleware.core.contracts.limits import MAX_ID_CHARS, MAX_SLOTS
from meshroute_middleware.core.objectives import OBJECTIVES
from meshroute_middleware.http.errors import HttpError

__all__ = ["openapi_document"]

_ERROR = {"$ref": "#/components/schemas/Error"}
_NODE_REF = {"$ref": "#/components/schemas/Node"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*errors: HttpError) -> dict[str, Any]:
    """The error answers of an endpoint, by status (from http/errors.py's table)."""
    statuses = dict.fromkeys(e.status for e in errors)
    text = {400: "invalid request", 401: "missing or wrong bearer token",
            403: "not allowed for this key (model_not_allowed; /v1/usage: another client)",
            404: "not found",
            413: "body too large, or past a shape limit (too_many_messages, "
                 "too_many_content_parts, too_many_values)",
            429: "a route was rate limited, cooling down or out of budget (Retry-After)",
            500: "internal error (a bug; logged by the server)",
            502: "every route tried failed upstream, or its keys were refused "
                 "(upstream_failed)",
            503: "no route available", 504: "the request's deadline ran out"}
    return {str(s): _json(_ERROR, text[s]) for s in statuses}


# What the routed paths (chat, the dialects, embeddings, completions) may answer.
_CHAT_ERRORS = (HttpError.INVALID_REQUEST, HttpError.MISSING_API_KEY, HttpError.MODEL_NOT_ALLOWED,
                HttpError.MODEL_NOT_FOUND, HttpError.REQUEST_TOO_LARGE, HttpError.RATE_LIMITED,
                HttpError.INTERNAL, HttpError.UPSTREAM_FAILED, HttpError.NO_ROUTE,
                HttpError.DEADLINE)
_COUNT_ERRORS = (HttpError.INVALID_REQUEST, HttpError.MISSING_API_KEY,
                 HttpError.REQUEST_TOO_LARGE, HttpError.RATE_LIMITED)

_USAGE: dict[str, Any] = {
    "type": "object", "required": ["object", "group_by", "since", "data"],
    "properties": {
        "object": {"type": "string"}, "group_by": {"type": "string"},
        "since": {"type": "number"}, "client": {"type": "string", "nullable": True},
        "data": {"type": "array", "items": {
            "type": "object",
            "required": ["requests", "prompt_tokens", "completion_tokens", "cost_usd",
                         "errors", "cached_tokens", "cache_write_tokens"],
            "properties": {
                "client": {"type": "string"}, "route": {"type": "string"},
                "day": {"type": "integer"}, "date": {"type": "string"},
                "requests": {"type": "integer"}, "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"}, "cost_usd": {"type": "number"},
                "errors": {"type": "integer"}, "cached_tokens": {"type": "integer"},
                "cache_write_tokens": {"type": "integer"}}}}},
}

def _anthropic_errors(*errors: HttpError) -> dict[str, Any]:
    """Errors of the Messages endpoints: Anthropic's shape (docs/apis.md)."""
    ref = {"$ref": "#/components/schemas/AnthropicError"}
    return {s: _json(ref, f"{d['description']} (Anthropic's error shape)")
            for s, d in _errors(*errors).items()}


_NODE: dict[str, Any] = {
    "type": "object",
    "required": ["node_id", "model", "start", "end", "layers", "url"],
    "properties": {
        "node_id": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS,
                    "pattern": "^[A-Za-z0-9._:@/+-]+$"},
        "model": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
        "start": {"type": "integer", "minimum": 0},
        "end": {"type": "integer", "minimum": 0},
        "layers": {"type": "integer", "minimum": 1},
        "url": {"type": "string", "pattern": "^https?://[^/?#]+",
                "description": "http(s) base URL of the node's server"},
        "tps": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        "queue": {"type": "integer", "minimum": 0},
        "rep": {"type": "number", "minimum": 0, "maximum": 1},
        "caps": {"type": "array", "maxItems": 5, "uniqueItems": True,
                 "items": {"type": "string", "enum": list(CAPABILITIES)},
                 "description": "what it serves beyond plain chat; absent: tools and "
                                "json_schema"},
        "cache_hit": {"type": "number", "minimum": 0, "maximum": 1,
                      "description": "share of prompt tokens its server found in its prefix "
                                     "cache, where it says (core/cache_prior.py)"},
        "cache_tokens": {"type": "integer", "minimum": 0, "maximum": MAX_CACHE_TOKENS,
                         "description": "most prompt tokens one of its slots holds"},
        "slots": {"type": "integer", "minimum": 1, "maximum": MAX_SLOTS,
                  "description": "requests its server runs at once (more queue): the prior "
                                 "of its routes' saturation knee (core/slot_count.py)"},
    },
}

_OBJECT = {"type": "object"}


def _routed(summary: str, schema: str, answer: str) -> dict[str, Any]:
    """A routed endpoint beside chat: its body's schema, the relayed answer, the errors."""
    return {"summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{schema}"}}}},
            "responses": {
                "200": {"description": answer,
                        "content": {"application/json": {"schema": _OBJECT},
                                    "text/event-stream": {"schema": {"type": "string"}}}},
                **_errors(*_CHAT_ERRORS)}}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document as a JSON-ready dict (a new dict on every call)."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "meshroute gateway", "version": "1",
                 "description": "A learned router for LLM chat traffic. Every error is an "
                                "OpenAI-style JSON body."},
        "paths": {
            "/v1/chat/completions": {"post": {
                "summary": "Route a chat completion (OpenAI-compatible)",
                "security": [{"bearer": []}, {"apiKey": []}, {}],  # with [[clients]]: one
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ChatRequest"}}}},
                "responses": {
                    "200": {"description": "the head's answer, relayed (JSON, or SSE when "
                                           "stream is true; a stream that breaks ends with "
                                           "an SSE error event)",
                            "content": {"application/json": {"schema": _OBJECT},
                                        "text/event-stream": {"schema": {"type": "string"}}}},
                    **_errors(*_CHAT_ERRORS)}}},
            "/v1/messages": {"post": {
                "summary": "Anthropic Messages, over the chat path (docs/apis.md)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/MessagesRequest"}}}},
                "responses": {
                    "200": {"description": "a `message`, or its SSE events when stream is "
                                           "true (a stream that breaks ends with an `error` "
                                           "event)",
                            "content": {"application/json": {"schema": _OBJECT},
                                        "text/event-stream": {"schema": {"type": "string"}}}},
                    **_anthropic_errors(*_CHAT_ERRORS)}}},
            "/v1/messages/count_tokens": {"post": {
                "summary": "The prompt's token estimate, answered locally",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/MessagesRequest"}}}},
                "responses": {
                    "200": _json({"type": "object", "required": ["input_tokens"],
                                  "properties": {"input_tokens": {"type": "integer"}}},
                                 "the estimate"),
                    **_anthropic_errors(*_COUNT_ERRORS)}}},
            "/v1/embeddings": {"post": _routed(
                "Route an embeddings request to a route declaring `embeddings`",
                "EmbeddingsRequest", "the route's vectors, relayed")},
            "/v1/completions": {"post": _routed(
                "Route a (legacy) completions request to a route declaring `completions`",
                "CompletionRequest", "the head's answer, relayed (JSON, or SSE when stream "
                "is true)")},
            "/v1/responses": {"post": {
                "summary": "OpenAI Responses, the stateless subset, over the chat path "
                           "(docs/apis.md)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ResponsesRequest"}}}},
                "responses": {
                    "200": {"description": "a response object (JSON), or the Responses SSE "
                                           "events when stream is true (a stream that breaks "
                                           "ends with error and response.failed events)",
                            "content": {"application/json": {"schema": _OBJECT},
                                        "text/event-stream": {"schema": {"type": "string"}}}},
                    **_errors(*_CHAT_ERRORS)}}},
            "/v1/models": {"get": {
                "summary": "Models the router can route",
                "responses": {"200": _json({"type": "object", "required": ["object", "data"],
                                            "properties": {"object": {"type": "string"},
                                                           "data": {"type": "array"}}},
                                           "OpenAI model list")}}},
            "/v1/models/{model_id}": {"get": {
                "summary": "One model, as /v1/models lists it, or a name an alias accepts",
                "parameters": [{"name": "model_id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": _json({"type": "object",
                                            "required": ["id", "object", "owned_by"]},
                                           "OpenAI model object"),
                              **_errors(HttpError.MODEL_NOT_FOUND)}}},
            "/v1/nodes": {
                "get": {"summary": "The topology's node records",
                        "responses": {"200": _json({"type": "object", "required": ["nodes"],
                                                    "properties": {"nodes": {
                                                        "type": "array", "items": _NODE_REF}}},
                                                   "node records")}},
                "post": {"summary": "Register or refresh a node record",
                         "security": [{"bearer": []}, {}],
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": _NODE_REF}}},
                         "responses": {
                             "200": _json(_OBJECT, "refreshed"),
                             "201": _json(_OBJECT, "joined"),
                             **_errors(HttpError.INVALID_NODE, HttpError.UNAUTHORIZED,
                                       HttpError.REQUEST_TOO_LARGE)}}},
            "/v1/nodes/{node_id}": {"delete": {
                "summary": "Remove a node",
                "security": [{"bearer": []}, {}],
                "parameters": [{"name": "node_id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": _json(_OBJECT, "removed"),
                              **_errors(HttpError.UNAUTHORIZED, HttpError.NODE_NOT_FOUND)}}},
            "/v1/routing": {"get": {
                "summary": "The learned routing table",
                "parameters": [{"name": "model", "in": "query", "required": False,
                                "schema": {"type": "string"}}],
                "responses": {"200": _json({"type": "object", "required": ["models"]},
                                           "routing table"),
                              **_errors(HttpError.MODEL_NOT_FOUND)}}},
            "/v1/routing/events": {"get": {
                "summary": "Routing events as Server-Sent Events (history, then live)",
                "parameters": [{"name": "since", "in": "query", "required": False,
                                "schema": {"type": "integer"}},
                               {"name": "Last-Event-ID", "in": "header", "required": False,
                                "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "an endless event stream",
                                      "content": {"text/event-stream": {
                                          "schema": {"type": "string"}}}},
                              **_errors(HttpError.INVALID_SINCE)}}},
            "/v1/usage": {"get": {
                "summary": "The usage ledger: requests, tokens, cost and errors by client, "
                           "route or UTC day (the admin token sees every client; a client's "
                           "key its own rows)",
                "security": [{"bearer": []}, {"apiKey": []}, {}],
                "parameters": [
                    {"name": "client", "in": "query", "required": False,
                     "schema": {"type": "string"}},
                    {"name": "since", "in": "query", "required": False,
                     "schema": {"type": "number", "minimum": 0},
                     "description": "UNIX seconds; rows from its UTC day on"},
                    {"name": "group_by", "in": "query", "required": False,
                     "schema": {"type": "string", "default": "client"},
                     "description": "client, route or day, or a comma list of them"}],
                "responses": {"200": _json(_USAGE, "ledger rows"),
                              **_errors(HttpError.INVALID_SINCE, HttpError.MISSING_API_KEY,
                                      HttpError.FORBIDDEN,
                                      HttpError.LIMITS_STORE_UNAVAILABLE)}}},
            "/metrics": {"get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text exposition", "content": {
                    "text/plain": {"schema": {"type": "string"}}}}}}},
            "/healthz": {"get": {
                "summary": "Liveness",
                "responses": {"200": _json({"type": "object",
                                            "required": ["ok", "models", "tracker"],
                                            "properties": {"ok": {"type": "boolean"},
                                                           "models": {"type": "array"},
                                                           "tracker": {"type": "string"}}},
                                           "alive"),
                              "503": _json({"type": "object",
                                            "required": ["ok", "degraded"],
                                            "properties": {"ok": {"type": "boolean"},
                                                           "degraded": {"type": "object"}}},
                                           "a background service failed and is "
                                           "restarting; `degraded` maps each to its error")}}},
            "/dashboard": {"get": {
                "summary": "The live routing dashboard",
                "responses": {"200": {"description": "HTML page", "content": {
                    "text/html": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {
                "summary": "This document",
                "responses": {"200": _json(_OBJECT, "OpenAPI 3.0 document")}}},
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "--node-token, when set; on chat, a client key "
                                          "when [[clients]] are configured; on /v1/usage "
                                          "the admin token or a client's key"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
                           "description": "a client key, when [[clients]] are configured "
                                          "(chat, /v1/usage)"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["message", "type", "code"],
                    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                   "code": {"type": "string"}}}}},
                "AnthropicError": {
                    "type": "object", "required": ["type", "error"], "properties": {
                        "type": {"type": "string", "enum": ["error"]},
                        "error": {"type": "object", "required": ["type", "message"],
                                  "properties": {"type": {"type": "string"},
                                                 "message": {"type": "string"}}}}},
                "MessagesRequest": {
                    "type": "object", "required": ["model", "messages"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "max_tokens": {"type": "integer", "minimum": 1},
                        "system": {"type": "string"},
                        "messages": {"type": "array", "items": _OBJECT},
                        "stream": {"type": "boolean"}}},
                "Node": _NODE,
                "EmbeddingsRequest": {
                    "type": "object", "required": ["model", "input"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "input": {"oneOf": [
                            {"type": "string", "minLength": 1},
                            {"type": "array", "minItems": 1, "maxItems": 2048,
                             "items": {"type": "string", "minLength": 1}},
                            {"type": "array", "minItems": 1,
                             "items": {"type": "integer", "minimum": 0}}]},
                        "dimensions": {"type": "integer", "minimum": 1},
                        "encoding_format": {"type": "string", "enum": ["float", "base64"]}}},
                "CompletionRequest": {
                    "type": "object", "required": ["model", "prompt"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "prompt": {"oneOf": [
                            {"type": "string", "minLength": 1},
                            {"type": "array", "minItems": 1,
                             "items": {"type": "string", "minLength": 1}}]},
                        "max_tokens": {"type": "integer", "minimum": 1},
                        "stream": {"type": "boolean"}}},
                "ChatRequest": {
                    "type": "object", "required": ["model"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "messages": {"type": "array", "items": _OBJECT},
                        "stream": {"type": "boolean"},
                        "route": {"type": "array", "minItems": 1,
                                  "items": {"type": "string", "minLength": 1},
                                  "description": "pin a route: node ids, head first"},
                        "meshroute": {
                            "type": "object", "additionalProperties": False,
                            "description": "meshroute's own options, never forwarded",
                            "properties": {"objective": {
                                "enum": list(OBJECTIVES),
                                "description": "what the route should be best at (also "
                                               "the x-meshroute-objective header)"}}}}},
                "ResponsesRequest": {
                    "type": "object", "required": ["model", "input"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "input": {"oneOf": [{"type": "string"},
                                            {"type": "array", "items": _OBJECT}]},
                        "instructions": {"type": "string"},
                        "tools": {"type": "array", "items": _OBJECT,
                                  "description": "function tools only"},
                        "max_output_tokens": {"type": "integer", "minimum": 1},
                        "stream": {"type": "boolean"},
                        "store": {"type": "boolean",
                                  "description": "accepted; nothing is ever stored"}}},
            },
        },
    }
