"""The gateway's HTTP surface as an OpenAPI 3.1 document, served at `GET /openapi.json`.

Sessions (admin key), the traced generations under a session's base URL (`/s/{sid}/v1/...`,
the session's key) and the untraced ones at the root (admin key). Request schemas describe
what the gateway accepts of the OpenAI Chat Completions and Anthropic Messages APIs; each
family's errors have its native shape. `GET /sessions/{sid}` returns the `SessionTrace`
model. `tests/integration/test_fuzz_http.py` fuzzes a running gateway against it.
"""

from __future__ import annotations

from typing import Any

from tracerl.engine.openapi import TEXT, json_body, model_schemas, responses
from tracerl.trace.schema import SessionTrace

OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
        }
    },
}
ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}
OPENAI_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "oneOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": _TEXT_PART}],
        },
        "name": {"type": "string"},
        "tool_call_id": {"type": "string"},
        "tool_calls": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "type", "function"],
                "properties": {
                    "id": {"type": "string"},
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "required": ["name", "arguments"],
                        "properties": {
                            "name": {"type": "string"},
                            "arguments": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}
_FUNCTION_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
            },
        },
    },
}
_PLAIN_FORMAT = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}},
}
_SCHEMA_FORMAT = {  # the Responses API's and Anthropic's: the schema at the top level
    "type": "object",
    "required": ["type", "schema"],
    "properties": {
        "type": {"type": "string", "enum": ["json_schema"]},
        "name": {"type": "string"},
        "schema": {"type": "object"},
        "strict": {"type": "boolean"},
    },
}
CHAT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": OPENAI_MESSAGE},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "seed": {"type": "integer"},
        "stop": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        },
        "n": {"type": "integer", "enum": [1]},
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "logprobs": {"type": "boolean"},
        "response_format": {
            "oneOf": [
                _PLAIN_FORMAT,
                {
                    "type": "object",
                    "required": ["type", "json_schema"],
                    "properties": {
                        "type": {"type": "string", "enum": ["json_schema"]},
                        "json_schema": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "schema": {"type": "object"},
                                "strict": {"type": "boolean"},
                            },
                        },
                    },
                },
            ]
        },
        "tools": {"type": "array", "items": _FUNCTION_TOOL},
        "demonstration": {
            "type": "object",
            "description": "tracerl: an assistant message recorded as this turn's reply instead "
            "of a sampled one (scripted demonstrations; in a session, not streamed)",
        },
        "tool_choice": {
            "oneOf": [
                {"type": "string", "enum": ["auto", "none", "required"]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"type": "string", "enum": ["function"]},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}},
                        },
                    },
                },
            ]
        },
    },
}
_BLOCK = {
    "oneOf": [
        _TEXT_PART,
        {
            "type": "object",
            "required": ["type", "id", "name", "input"],
            "properties": {
                "type": {"type": "string", "enum": ["tool_use"]},
                "id": {"type": "string"},
                "name": {"type": "string"},
                "input": {"type": "object"},
            },
        },
        {
            "type": "object",
            "required": ["type", "tool_use_id"],
            "properties": {
                "type": {"type": "string", "enum": ["tool_result"]},
                "tool_use_id": {"type": "string"},
                "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
            },
        },
    ]
}
MESSAGES_REQUEST = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"type": "string", "enum": ["user", "assistant", "system"]},
                    "content": {
                        "oneOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}],
                    },
                },
            },
        },
        "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "stream": {"type": "boolean"},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "input_schema"],
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "input_schema": {"type": "object"},
                },
            },
        },
        "tool_choice": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
                "name": {"type": "string"},
            },
        },
        "metadata": {"type": "object"},
        "output_config": {"type": "object", "properties": {"format": _SCHEMA_FORMAT}},
    },
}
_RESPONSES_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {
        "type": {"type": "string", "enum": ["input_text", "output_text"]},
        "text": {"type": "string"},
    },
}
_RESPONSES_ITEM = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "type": {"type": "string", "enum": ["message"]},
                "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
                "content": {
                    "oneOf": [{"type": "string"}, {"type": "array", "items": _RESPONSES_PART}]
                },
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"type": "string", "enum": ["function_call"]},
                "call_id": {"type": "string"},
                "name": {"type": "string", "minLength": 1},
                "arguments": {"type": "string"},
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"type": "string", "enum": ["function_call_output"]},
                "call_id": {"type": "string"},
                "output": {"type": "string"},
            },
        },
    ]
}
RESPONSES_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string"},
        "input": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": _RESPONSES_ITEM},
            ]
        },
        "instructions": {"type": "string"},
        "previous_response_id": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "store": {"type": "boolean"},
        "text": {
            "type": "object",
            "properties": {"format": {"oneOf": [_PLAIN_FORMAT, _SCHEMA_FORMAT]}},
        },
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "name"],
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "name": {"type": "string", "minLength": 1},
                    "description": {"type": "string"},
                    "parameters": {"type": "object"},
                },
            },
        },
        "tool_choice": {"type": "string", "enum": ["auto", "none"]},
    },
}
RESPONSES_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
COUNT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        key: MESSAGES_REQUEST["properties"][key]  # type: ignore[index]
        for key in ("model", "messages", "system", "tools")
    },
}
SESSION = {
    "type": "object",
    "required": ["session_id", "api_key", "openai_base_url", "anthropic_base_url"],
    "properties": {
        "session_id": {"type": "string"},
        "api_key": {"type": "string"},
        "openai_base_url": {"type": "string"},
        "anthropic_base_url": {"type": "string"},
    },
}
_SID = {"name": "sid", "in": "path", "required": True, "schema": {"type": "string"}}
_JSON_OR_SSE = {
    "application/json": {"schema": {"type": "object"}},
    "text/event-stream": {"schema": {"type": "string"}},
}
_OBJECT = {"application/json": {"schema": {"type": "object"}}}
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
_ANTHROPIC_KEY: list[dict[str, list[str]]] = [{"x-api-key": []}, {"bearer": []}]


def _generation(
    request: str, anthropic: bool, session: bool, error: str | None = None
) -> dict[str, Any]:
    error = error or ("AnthropicError" if anthropic else "OpenAIError")
    operation: dict[str, Any] = {
        "security": _ANTHROPIC_KEY if anthropic else _BEARER,
        "requestBody": json_body({"$ref": f"#/components/schemas/{request}"}),
        "responses": responses(_JSON_OR_SSE, 400, 401, 404, 409, 413, 503, error=error),
    }
    if session:
        operation["parameters"] = [_SID]
        operation["summary"] = "A traced generation: recorded as a turn of the session"
    else:
        operation["summary"] = "An untraced generation (admin key): never recorded"
    return {"post": operation}


def _admin(ok: dict[str, Any], *errors: int, sid: bool = False) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "security": _BEARER,
        "responses": responses(ok, *errors, error="OpenAIError"),
    }
    if sid:
        operation["parameters"] = [_SID]
    return operation


def gateway_openapi() -> dict[str, Any]:
    messages = _generation("MessagesRequest", anthropic=True, session=True)
    count = {
        "post": {
            "parameters": [_SID],
            "security": _ANTHROPIC_KEY,
            "requestBody": json_body({"$ref": "#/components/schemas/CountTokensRequest"}),
            "responses": responses(_OBJECT, 400, 401, 404, error="AnthropicError"),
        }
    }
    models = {
        "get": {
            "parameters": [_SID],
            "security": _ANTHROPIC_KEY,
            "responses": responses(_OBJECT),
        }
    }
    session = {"application/json": {"schema": {"$ref": "#/components/schemas/Session"}}}
    create = _admin(session, 400, 401)
    create["requestBody"] = json_body(
        {
            "type": "object",
            "properties": {
                "system_prompt": {"type": "string"},
                "metadata": {"type": "object"},
                "traceparent": {"type": "string"},  # W3C; ignored unless valid
            },
        },
        required=False,
    )
    trace = {"application/json": {"schema": {"$ref": "#/components/schemas/SessionTrace"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tracerl gateway", "version": "1"},
        "paths": {
            "/sessions": {"post": create},
            "/sessions/{sid}": {"get": _admin(trace, 401, 404, sid=True)},
            "/sessions/{sid}/close": {"post": _admin(_OBJECT, 401, 404, sid=True)},
            "/s/{sid}/v1/chat/completions": _generation("ChatRequest", False, session=True),
            "/s/{sid}/v1/responses": _generation(
                "ResponsesRequest", False, session=True, error="ResponsesError"
            ),
            "/s/{sid}/v1/messages": messages,
            "/s/{sid}/v1/messages/count_tokens": count,
            "/s/{sid}/v1/models": models,
            "/v1/chat/completions": _generation("ChatRequest", False, session=False),
            "/v1/messages": _generation("MessagesRequest", True, session=False),
            "/v1/responses": _generation(
                "ResponsesRequest", False, session=False, error="ResponsesError"
            ),
            "/health": {"get": {"responses": responses(_OBJECT)}},
            "/metrics": {"get": {"responses": responses(TEXT)}},
            "/openapi.json": {"get": {"responses": responses(_OBJECT)}},
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
            "schemas": {
                "ChatRequest": CHAT_REQUEST,
                "MessagesRequest": MESSAGES_REQUEST,
                "CountTokensRequest": COUNT_REQUEST,
                "ResponsesRequest": RESPONSES_REQUEST,
                "ResponsesError": RESPONSES_ERROR,
                "Session": SESSION,
                "OpenAIError": OPENAI_ERROR,
                "AnthropicError": ANTHROPIC_ERROR,
                **model_schemas(SessionTrace),
            },
        },
    }
