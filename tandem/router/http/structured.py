"""OpenAI ``response_format`` and vLLM's structured-output extras -> ``StructuredOutput``
(tandem/router/api/sampling.py).

    response_format {"type": "json_object"}                      -> json_object
    response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
                                                                  -> json_schema (the schema)
    structured_outputs {"json" | "regex" | "choice" | "grammar"}  (vLLM >= 0.10)
    guided_json | guided_regex | guided_choice | guided_grammar   (vLLM's older names)

At most one may be given. Shapes only: sizes and complexity are tandem/router/validation.py's
(tandem/router/grammar_limits.py), and a schema or grammar that does not compile, or not within
the workers' compile budget, is refused by the worker's grammar engine with its reason.
"""

from __future__ import annotations

import json
from typing import Any

from tandem.router.api.sampling import StructuredOutput
from tandem.router.errors import InvalidRequestError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def parse_structured(body: dict[str, Any]) -> StructuredOutput | None:
    """The constraint of whichever structured-output field ``body`` has (None: none)."""
    found: list[tuple[str, str, Any]] = []  # (field, kind, value)
    fmt = body.get("response_format")
    if fmt is not None:
        found += _response_format(fmt)
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise InvalidRequestError("structured_outputs", "must be a JSON object")
        found += [(f"structured_outputs.{k}", k, v) for k, v in so.items() if v is not None
                  and k in ("json", "regex", "choice", "grammar", "json_object")]
    found += [(name, kind, body[name]) for name, kind in _GUIDED.items()
              if body.get(name) is not None]
    if len(found) > 1:
        raise InvalidRequestError(
            found[1][0], f"only one structured output at a time (also got {found[0][0]})"
        )
    return _constraint(*found[0]) if found else None


def _response_format(fmt: Any) -> list[tuple[str, str, Any]]:
    if not isinstance(fmt, dict):
        raise InvalidRequestError("response_format", "must be a JSON object")
    kind = fmt.get("type", "text")
    if kind == "text":
        return []
    if kind == "json_object":
        return [("response_format", "json_object", True)]
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidRequestError("response_format.json_schema", "must be a JSON object")
        schema = spec.get("schema", {"type": "object"})  # OpenAI: schema is optional
        return [("response_format.json_schema.schema", "json", schema)]
    raise InvalidRequestError(
        "response_format.type", f"{kind!r}; one of 'text', 'json_object', 'json_schema'"
    )


def _constraint(field: str, kind: str, value: Any) -> StructuredOutput:
    if kind == "json_object":
        if value is not True:
            raise InvalidRequestError(field, "must be true")
        return StructuredOutput("json_object", True)
    if kind == "json":
        try:
            if isinstance(value, str):  # vLLM accepts the schema as text too
                value = json.loads(value)
            if not isinstance(value, (dict, bool)):
                raise InvalidRequestError(field, "must be a JSON Schema object")
            return StructuredOutput("json_schema", json.dumps(value, separators=(",", ":")))
        except RecursionError:  # nested past the parser's stack: far past any depth limit
            raise InvalidRequestError(field, "nested too deeply") from None
        except ValueError as err:
            raise InvalidRequestError(field, f"not JSON: {err}") from None
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(
            isinstance(c, str) and c for c in value
        ):
            raise InvalidRequestError(field, "must be a non-empty list of non-empty strings")
        return StructuredOutput("choice", tuple(value))
    if not isinstance(value, str) or not value:  # regex, grammar
        raise InvalidRequestError(field, "must be a non-empty string")
    return StructuredOutput("regex" if kind == "regex" else "grammar", value)
