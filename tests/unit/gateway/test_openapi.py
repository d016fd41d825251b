"""The published OpenAPI documents cover every route the servers register (no drift)."""

from typing import Any

import schemathesis

from tracerl.engine.openapi import engine_openapi
from tracerl.engine.server import build_engine_app
from tracerl.gateway.openapi import gateway_openapi
from tracerl.gateway.server import _ROUTES, Gateway


def routes(app: Any) -> set[tuple[str, str]]:
    return {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }


def documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}


def test_the_engine_document_is_every_engine_route() -> None:
    doc = engine_openapi()
    assert documented(doc) == routes(build_engine_app(object()))  # type: ignore[arg-type]
    assert list(schemathesis.openapi.from_dict(doc).get_all_operations())  # a loadable schema


def test_the_gateway_document_has_every_route_and_session_route(tiny: tuple[Any, Any]) -> None:
    _, tokenizer = tiny
    gateway = Gateway(object(), tokenizer, object(), model_name="tiny", eos_ids={0})  # type: ignore[arg-type]
    doc = documented(gateway_openapi())
    served = {r for r in routes(gateway.app()) if r[0] != "*"}
    assert served <= doc
    for method, path in _ROUTES:
        assert (method, f"/s/{{sid}}{path}") in doc, (method, path)
    assert ("POST", "/v1/chat/completions") in doc and ("POST", "/v1/messages") in doc
