"""A small Schema Registry for the tests: a real HTTP server on a free port of 127.0.0.1 that
speaks the part of Confluent's REST API that ``confluent_kafka.schema_registry``'s client
uses here (no Schema Registry server can be installed on this machine: Confluent's is Java
from Maven, Karapace is not on PyPI):

* ``POST /subjects/{subject}/versions`` registers a schema under a subject and answers its id
  (the same schema text: the same id, in any subject, as Confluent's does);
* ``GET /schemas/ids/{id}`` answers a schema by its id (404, error 40403, if none);
* ``GET /subjects/{subject}/versions/latest`` answers the subject's latest version (404,
  error 40401, if no such subject).

It keeps every request's method and path (``requests``), so that a test sees what the
client asked and how often.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import unquote, urlsplit


class SchemaRegistry:
    """``with SchemaRegistry() as registry:`` serves at ``registry.url`` until the block ends."""

    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def register(self, subject: str, schema: str | dict[str, Any]) -> int:
        """Register ``schema`` (JSON text, or a dict) under ``subject``; its id."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        with self.lock:
            found = [i for i, s in self.schemas.items() if s == text]
            schema_id = found[0] if found else len(self.schemas) + 1
            self.schemas[schema_id] = text
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id

    def fetched(self, schema_id: int) -> int:
        """How many times schema ``schema_id`` was asked for by its id."""
        return sum(path == f"/schemas/ids/{schema_id}" for _, path in self.requests)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exception: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _handler(registry: SchemaRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # (quiet)
            pass

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            registry.requests.append(("GET", path))
            if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
                text = registry.schemas.get(int(m.group(1)))
                if text is None:
                    return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                return self._answer(200, {"schema": text})
            if m := re.fullmatch(r"/subjects/([^/]+)/versions/latest", path):
                subject = unquote(m.group(1))
                versions = registry.subjects.get(subject)
                if not versions:
                    return self._answer(404, {"error_code": 40401, "message": "Subject not found"})
                schema_id = versions[-1]
                latest = {
                    "subject": subject,
                    "id": schema_id,
                    "version": len(versions),
                    "schema": registry.schemas[schema_id],
                }
                return self._answer(200, latest)
            self._answer(404, {"error_code": 404, "message": f"no {path} here"})

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            registry.requests.append(("POST", path))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                if body.get("schemaType", "AVRO") != "AVRO":
                    return self._answer(422, {"error_code": 42201, "message": "not Avro"})
                schema_id = registry.register(unquote(m.group(1)), body["schema"])
                return self._answer(200, {"id": schema_id})
            self._answer(404, {"error_code": 404, "message": f"no {path} here"})

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
