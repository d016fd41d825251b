"""The engine wire protocol as an OpenAPI 3.1 document, served at `GET /openapi.json`.

Request bodies come from the pydantic models the server validates with (`GenerateRequest`,
`SamplingParams`), so the document cannot drift from what is accepted; every error is
`{"error": {"message", "code", "field"?}}`. `tests/integration/test_fuzz_http.py` fuzzes a
running engine against it with schemathesis.
"""

from __future__ import annotations

from typing import Any

from tracerl.engine.protocol import PAUSE_MODES
from tracerl.engine.types import GenerateRequest

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "code"],
            "properties": {
                "message": {"type": "string"},
                "code": {"type": "integer"},
                "field": {"type": "string"},
            },
        }
    },
}


def model_schemas(*models: Any) -> dict[str, Any]:
    """The JSON schemas of pydantic `models` (and the models they use) as OpenAPI components."""
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def responses(ok: dict[str, Any], *errors: int, error: str = "Error") -> dict[str, Any]:
    """`200` with `ok` (a content map), and each error status with the `error` schema."""
    out: dict[str, Any] = {"200": {"description": "success", "content": ok}}
    for status in errors:
        out[str(status)] = {
            "description": "refused",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}},
        }
    return out


def _json(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"application/json": {"schema": schema or {"type": "object"}}}


TEXT = {"text/plain": {"schema": {"type": "string"}}}


def engine_openapi() -> dict[str, Any]:
    generate_ok = {**_json(), "text/event-stream": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tracerl engine", "version": "1"},
        "paths": {
            "/generate": {
                "post": {
                    "summary": "Generate from token ids (streaming with `stream: true`)",
                    "requestBody": json_body({"$ref": "#/components/schemas/GenerateRequest"}),
                    "responses": responses(generate_ok, 400, 413),
                }
            },
            "/abort_request": {
                "post": {
                    "requestBody": json_body(
                        {
                            "type": "object",
                            "properties": {
                                "rid": {"type": "string"},
                                "abort_all": {"type": "boolean"},
                            },
                        }
                    ),
                    "responses": responses(_json(), 400),
                }
            },
            "/pause_generation": {
                "post": {
                    "requestBody": json_body(
                        {
                            "type": "object",
                            "properties": {"mode": {"type": "string", "enum": list(PAUSE_MODES)}},
                        },
                        required=False,
                    ),
                    "responses": responses(_json(), 400),
                }
            },
            "/continue_generation": {"post": {"responses": responses(_json())}},
            "/update_weights_from_disk": {
                "post": {
                    "requestBody": json_body(
                        {
                            "type": "object",
                            "required": ["model_path", "weight_version"],
                            "properties": {
                                "model_path": {"type": "string"},
                                "weight_version": {"type": "integer"},
                            },
                        }
                    ),
                    "responses": responses(_json(), 400),
                }
            },
            "/load_lora_adapter": {
                "post": {
                    "requestBody": json_body(
                        {
                            "type": "object",
                            "required": ["lora_name", "lora_path", "weight_version"],
                            "properties": {
                                "lora_name": {"type": "string", "minLength": 1},
                                "lora_path": {"type": "string", "minLength": 1},
                                "weight_version": {"type": "integer"},
                            },
                        }
                    ),
                    "responses": responses(_json(), 400),
                }
            },
            "/health": {"get": {"responses": responses(_json(), 503)}},
            "/health_generate": {"get": {"responses": responses(_json(), 503)}},
            "/get_model_info": {"get": {"responses": responses(_json())}},
            "/metrics": {"get": {"responses": responses(TEXT)}},
            "/openapi.json": {"get": {"responses": responses(_json())}},
        },
        "components": {"schemas": {**model_schemas(GenerateRequest), "Error": ERROR}},
    }
