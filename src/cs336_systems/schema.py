"""JSON Schema as this project checks it: Draft 2020-12, except that an `integer` is an int.

jsonschema follows the standard, which counts 2.0 as an integer; a `batch_size: 2.0` in the
config, or a context length of 16.0 in a record, is a mistake this project would rather name
than pass on to a `range()` or a file name. The config (`pipeline.config`) and the records
(`report.record_schemas`) are checked with the validator made here.
"""

from __future__ import annotations

from typing import Any

import jsonschema


def _is_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))


def validator(schema: dict) -> jsonschema.protocols.Validator:
    """A validator of `schema` whose `integer` refuses floats."""
    return Validator(schema)
