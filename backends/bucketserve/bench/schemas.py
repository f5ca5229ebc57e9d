"""The JSON schema structured-output tests and checks ask for: nested object, array, enum,
required fields (tests/server/test_guided.py, tests/unit/engine/test_guided_engine.py,
perf/tools/structured_check.py)."""

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "country": {"enum": ["France", "Spain", "Other"]},
            },
            "required": ["name", "country"],
        },  # fmt: skip
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "hobbies"],
}
