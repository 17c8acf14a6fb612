"""Shared pieces of the torchyard API: the group, the model base, conditions, patterns.

Every spec model derives from :class:`Model`: camelCase on the wire (as Kubernetes
writes it), snake_case in Python, unknown fields refused. Imported by the resource
modules of this package; no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic.alias_generators import to_camel

# Re-exported: defined once in wire.py.
from torchyard.api.wire import API_VERSION as API_VERSION
from torchyard.api.wire import GROUP as GROUP
from torchyard.api.wire import VERSION as VERSION

CATEGORY = "torchyard"

# Kubernetes' own patterns, so that a value the API models accept is one the
# apiserver accepts too (and the other way round).
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A non-negative quantity with a whole exponent: what Kubernetes parses as a resource
# amount (it refuses "1e1.5"; a negative size would only fail later, at Pod creation).
QUANTITY = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
)
QUANTITY_MAX_LENGTH = 64
ENV_VAR_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A label value, and the name part of a label key (at most 63 characters each; a key may
# have a DNS-1123 subdomain prefix of at most 253 and a '/'): what a node's labels are.
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX_LENGTH = 63
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_KEY_PREFIX_MAX_LENGTH = 253


def label_key_cel(expr: str) -> str:
    """The CEL rule that the string ``expr`` is a label key (:func:`label_key` in CEL)."""
    return (
        f"{expr}.matches(r'{LABEL_KEY}') && "
        f"size({expr}) - {expr}.lastIndexOf('/') - 1 <= {LABEL_VALUE_MAX_LENGTH} && "
        f"{expr}.lastIndexOf('/') <= {LABEL_KEY_PREFIX_MAX_LENGTH}"
    )


def label_key(key: str) -> bool:
    """``key`` is a label key (the CEL rules of label-key fields, in Python)."""
    slash = key.rfind("/")
    return (
        re.fullmatch(LABEL_KEY, key) is not None
        and len(key) - slash - 1 <= LABEL_VALUE_MAX_LENGTH
        and slash <= LABEL_KEY_PREFIX_MAX_LENGTH
    )


# A string that reaches a process's argv or environment (a C string: NUL ends it, so a
# NUL byte would cut the argument short, or make the runtime refuse to start the Pod).
NO_NUL = r"^[^\x00]*$"
NO_NUL_RULE = (
    "must not contain a NUL byte (\\u0000): a process's arguments and environment are C "
    "strings, which end at the first NUL"
)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{NO_NUL_RULE}; got {value!r}")
    return value


# A string without a NUL byte: the CRD's pattern, and the same check with a message here.
NoNulStr = Annotated[str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": NO_NUL})]


BASE_CONFIG = ConfigDict(
    alias_generator=to_camel,
    populate_by_name=True,
    extra="forbid",
    frozen=True,
)


def with_rules(*rules: dict[str, Any]) -> ConfigDict:
    """The base config plus CEL rules (``x-kubernetes-validations``) for the CRD."""
    return ConfigDict(**BASE_CONFIG, json_schema_extra={"x-kubernetes-validations": list(rules)})


class Model(BaseModel):
    """Base of every torchyard API object: camelCase aliases, unknown fields refused."""

    model_config = BASE_CONFIG

    def to_dict(self) -> dict[str, Any]:
        """The wire form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


M = TypeVar("M", bound=Model)


def registered_model(
    base: type[M],
    fields: dict[str, Any],
    check: Callable[[M], M],
    rules: Iterable[dict[str, Any]],
) -> type[M]:
    """The model of a registry's variants (a policy's, an expression's, an input's): a
    subclass of ``base`` with ``fields`` (the registered variants'), checked by ``check``
    once its fields are (the rules' twins), whose schema carries the CEL ``rules``. Made
    anew when the registry changes (the caller caches it by the registry's generation)."""
    validators: dict[str, Any] = {"_rules": model_validator(mode="after")(check)}
    model = create_model(
        base.__name__, __base__=base, __doc__=base.__doc__, __validators__=validators, **fields
    )
    model.model_config = with_rules(*rules)
    return model


def schema_of(made: Callable[[], type[Model]]) -> ConfigDict:
    """The config of a base model whose schema is that of ``made()``, the registered
    variants' model of the moment (:func:`registered_model`): what the CRD is made of."""

    def extra(schema: dict[str, Any], cls: type[Any]) -> None:
        model = made()
        if cls is not model:
            schema.clear()
            schema.update(model.model_json_schema(by_alias=True, mode="validation"))

    return ConfigDict(**BASE_CONFIG, json_schema_extra=extra)


class Named:
    """What a resource model (TrainingRun, Sweep) reads of its metadata, a plain mapping."""

    if TYPE_CHECKING:
        metadata: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")

    @property
    def generation(self) -> int | None:
        gen = self.metadata.get("generation")
        return int(gen) if gen is not None else None

    def check_name(self, most: int, rule: str) -> None:
        """ValueError with ``rule`` unless the name (when set) is a DNS-1035 label of at
        most ``most`` characters: what the resource's children are named after."""
        name = self.metadata.get("name")
        if name is not None and not (
            len(str(name)) <= most and re.fullmatch(DNS1035_LABEL, str(name))
        ):
            raise ValueError(f"metadata.name: {rule}")


def memory_floor_rule(minimum: str, message: str) -> dict[str, Any]:
    """The CEL rule that a ``memory`` quantity is at least ``minimum`` (isQuantity first: a
    value the pattern lets through but Kubernetes cannot parse is the pattern's to refuse)."""
    return {
        "rule": "!has(self.memory) || !isQuantity(self.memory) || "
        f"quantity(self.memory).compareTo(quantity('{minimum}')) >= 0",
        "message": message,
        "fieldPath": ".memory",
        "reason": "FieldValueInvalid",
    }


def service_account(description: str) -> Any:
    """A spec's ``serviceAccountName`` field (default ``default``)."""
    return Field(
        default="default",
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description=description,
    )


def observed_generation() -> Any:
    """A status's observedGeneration field."""
    return Field(default=None, description="The metadata.generation this status describes.")


def nested(model: type[Model], description: str) -> Any:
    """A sub-object field that defaults to the model's defaults (also in the CRD)."""
    return Field(
        default_factory=model,
        description=description,
        # The whole default object: the apiserver validates a default without
        # defaulting inside it first.
        json_schema_extra={"default": model().to_dict()},
    )


class Condition(Model):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str = Field(description="Type of the condition, in CamelCase, e.g. Ready or Succeeded.")
    status: Literal["True", "False", "Unknown"] = Field(
        description="Status of the condition: True, False or Unknown."
    )
    reason: str = Field(
        default="",
        description="A CamelCase word saying why the condition is in this state.",
    )
    message: str = Field(default="", description="A human-readable explanation.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the condition last changed status."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the condition was computed from."
    )


CONDITIONS_FIELD_EXTRA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
