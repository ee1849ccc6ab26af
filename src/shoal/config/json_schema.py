"""The JSON Schema of configs, as `shoal config schema` prints it and the docs render it.

pydantic leaves out the default of a field built by a factory (a nested table, an
empty list), so a reader of the schema could not tell a table that has defaults from
one that must be written. Such defaults are filled in here: every factory of a config
field is a plain constructor (no clock, no randomness), so calling it is safe.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema


class _WithFactoryDefaults(GenerateJsonSchema):
    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()  # type: ignore[call-arg]
        return schema.get("default", NoDefault)


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of a shoal config, every field's default included."""
    from shoal.config import ShoalConfig

    return ShoalConfig.model_json_schema(schema_generator=_WithFactoryDefaults)
