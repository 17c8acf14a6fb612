"""The registry package keeps one concern per module: ``service`` is the face (the route
table, ``serve``), and each route's handler lives in the module of its concern."""

from __future__ import annotations

from pathlib import Path

from tests.unit.registry.test_service import StandIn
from torchyard import registry
from torchyard.registry import Store, service

PACKAGE = Path(registry.__file__).parent


def test_no_module_of_the_registry_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert {"service.py", "variables.py", "access.py", "archives.py", "versions.py"} <= set(sizes)
    assert {name: size for name, size in sizes.items() if size > 400} == {}


def test_each_route_is_handled_by_the_module_of_its_concern(tmp_path: Path) -> None:
    app = service.create_app(Store(tmp_path), StandIn())
    where = {}
    for route in app.router.routes():
        handler = route.handler
        owner = getattr(handler, "__self__", None)
        module = type(owner).__module__ if owner is not None else handler.__module__
        where[(route.method, route.resource.canonical if route.resource else "")] = module
    runs = "/v1/namespaces/{ns}/runs/{run}/{kind}/{path}"
    models = "/v1/namespaces/{ns}/models/{model}/versions"
    assert where[("PUT", runs)] == "torchyard.registry.archives"
    assert where[("POST", runs)] == "torchyard.registry.archives"
    assert where[("PUT", "/v1/namespaces/{ns}/snapshots/{sha}")] == "torchyard.registry.archives"
    assert where[("POST", models)] == "torchyard.registry.versions"
    assert where[("GET", models + "/{v}/files/{path}")] == "torchyard.registry.versions"
    assert where[("GET", "/metrics")] == "torchyard.registry.service"
