"""Fifty JSON schemas of the kinds agents send: flat and nested objects, arrays of strings and of
objects, enums, integers and numbers with bounds, required and optional fields. Strings and
arrays carry a maxLength / maxItems and numbers a multipleOf, as production schemas usually do, so
every answer ends."""

SUBJECTS = ("book", "city", "recipe", "planet", "movie", "car", "song", "country", "animal", "company")


def text(max_length: int = 40) -> dict:
    return {"type": "string", "maxLength": max_length}


def integer(minimum: int, maximum: int) -> dict:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def number(minimum: float, maximum: float, step: float = 0.01) -> dict:
    """A bounded number of at most two decimals (without a step the model may write 5.0000...)."""
    return {"type": "number", "minimum": minimum, "maximum": maximum, "multipleOf": step}


def obj(properties: dict, optional: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties,
            "required": [name for name in properties if name not in optional], "additionalProperties": False}


def array(items: dict, max_items: int) -> dict:
    return {"type": "array", "items": items, "minItems": 1, "maxItems": max_items}


def schemas_for(subject: str) -> list[dict]:
    """Five schemas about one subject, one of each shape."""
    return [
        obj({"name": text(), "year": integer(1000, 2030), "famous": {"type": "boolean"}}),
        obj({"name": text(), "keywords": array(text(20), 4)}),
        obj({"name": text(), "category": {"enum": ["small", "medium", "large", "unknown"]},
             "rating": number(0, 5)}, optional=("rating",)),
        obj({"name": text(), "origin": obj({"place": text(30), "count": integer(0, 1000)}),
             "summary": text(80)}),
        obj({subject + "s": array(obj({"name": text(30), "score": integer(0, 100)}), 3)}),
    ]


def fifty_schemas() -> list[tuple[str, dict]]:
    """(subject, schema) pairs: five shapes for each of ten subjects."""
    return [(subject, schema) for subject in SUBJECTS for schema in schemas_for(subject)]
