"""A user's JSON Schema closed as a strict object (the schema llguidance compiles for it)."""

from __future__ import annotations


def closed(schema: object) -> object:
    """The schema with `additionalProperties: false` wherever an object lists its properties and
    says nothing of others, as llama.cpp's converter reads a schema (and OpenAI's strict mode asks):
    otherwise a small model pads its objects with keys nobody asked for."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("const", "enum", "default", "examples") else closed(v)) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out
