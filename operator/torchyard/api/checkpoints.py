"""``spec.checkpoints`` of a TrainingRun: the folder every rank saves to and resumes from.

Typed, with the CEL rules the apiserver enforces (part of the TrainingRun CRD, generated
by ``torchyard.api.crds``). Imported by ``api.trainingruns`` (the spec field and the rule
that needs the node count), read by ``planning.checkpoints`` (the claim, the volume and
the variables). Tested in tests/unit/api/test_checkpoints_spec.py and
tests/integration/test_checkpoints.py (the CEL rules on a real apiserver).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from torchyard.api._base import (
    DNS1123_SUBDOMAIN,
    QUANTITY,
    QUANTITY_MAX_LENGTH,
    Model,
    with_rules,
)
from torchyard.api.quantities import quantity

ONE_OF_RULE = (
    "checkpoints needs exactly one of claimName (an existing PersistentVolumeClaim) or size "
    "(a claim the operator creates for the run)"
)
SIZE_RULE = (
    "checkpoints.size must be more than 0 (a PersistentVolumeClaim asks for some storage), "
    "e.g. 50Gi"
)
CREATED_ONLY_RULE = (
    "checkpoints.storageClassName and checkpoints.accessMode describe the claim the operator "
    "creates: set them with size, not with claimName"
)
SHARED_RULE = (
    "a run of several nodes shares one checkpoint folder (every rank's rank-R.done and node "
    "0's COMPLETE.json): checkpoints.accessMode must be ReadWriteMany when "
    "distribution.nodeCount > 1 (or use a claimName whose volume is ReadWriteMany)"
)
# A spec-level rule (it needs distribution.nodeCount): added to the TrainingRun's rules.
SPEC_RULE: dict[str, Any] = {
    "rule": "!has(self.checkpoints) || !has(self.checkpoints.accessMode) || "
    "self.checkpoints.accessMode == 'ReadWriteMany' || self.distribution.nodeCount == 1",
    "message": SHARED_RULE,
    "fieldPath": ".checkpoints.accessMode",
    "reason": "FieldValueInvalid",
}


class Checkpoints(Model):
    """Where the run's checkpoints live (mounted in every node Pod at a fixed path, given
    to the ranks as TORCHYARD_CHECKPOINT_DIR), how often to save and how many to keep."""

    model_config = with_rules(
        {"rule": "has(self.claimName) != has(self.size)", "message": ONE_OF_RULE},
        {
            "rule": "has(self.size) || (!has(self.storageClassName) && !has(self.accessMode))",
            "message": CREATED_ONLY_RULE,
        },
        {
            # isQuantity first: the pattern says what is wrong with a non-quantity.
            "rule": "!has(self.size) || !isQuantity(self.size) || "
            "quantity(self.size).isGreaterThan(quantity('0'))",
            "message": SIZE_RULE,
            "fieldPath": ".size",
            "reason": "FieldValueInvalid",
        },
    )

    claim_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="An existing PersistentVolumeClaim in the run's namespace; it outlives "
        "the run (several runs may resume from one folder, one at a time). With several "
        "nodes its volume must be ReadWriteMany. The run waits (Admitted False, "
        "ClaimNotFound) until it exists.",
    )
    size: str | None = Field(
        default=None,
        pattern=QUANTITY,
        max_length=QUANTITY_MAX_LENGTH,
        description="Create a PersistentVolumeClaim <run>-checkpoints of this size for the "
        "run, owned by it (deleted with the run).",
    )
    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="StorageClass of the created claim (with size); unset: the cluster's default.",
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] | None = Field(
        default=None,
        description="Access mode of the created claim (with size). Default: ReadWriteOnce "
        "for one node, ReadWriteMany for several (every node writes the one folder).",
    )
    interval: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Save every this many steps: a hint the script reads through "
        "torchyard.checkpoint.should_save(step) (TORCHYARD_CHECKPOINT_INTERVAL).",
    )
    keep: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Keep the newest N complete checkpoints; node 0's launcher deletes "
        "older ones (and saves older than the newest complete one that never finished).",
    )
    max_attempts_without_progress: int = Field(
        default=3,
        ge=1,
        le=100,
        description="A resumed attempt whose code fails before getting past its checkpoint "
        "quarantines that checkpoint (quarantine-step-N) and the next attempt resumes from "
        "the one before; after this many such quarantines the run fails with reason "
        "NoProgress.",
    )

    @model_validator(mode="after")
    def _combinations(self) -> Checkpoints:
        if (self.claim_name is None) == (self.size is None):
            raise ValueError(ONE_OF_RULE)
        if self.size is None and (self.storage_class_name or self.access_mode):
            raise ValueError(CREATED_ONLY_RULE)
        if self.size is not None:
            try:
                empty = quantity(self.size) <= 0
            except ValueError:
                empty = False  # the pattern says what is wrong
            if empty:
                raise ValueError(f"{SIZE_RULE}; got {self.size}")
        return self

    def access_mode_for(self, node_count: int) -> str:
        """The created claim's access mode: as set, else by the node count."""
        if self.access_mode is not None:
            return self.access_mode
        return "ReadWriteMany" if node_count > 1 else "ReadWriteOnce"


def check_shared(checkpoints: Checkpoints | None, node_count: int) -> None:
    """SPEC_RULE in Python (the spec's validator calls it)."""
    shared = checkpoints is None or checkpoints.access_mode in (None, "ReadWriteMany")
    if node_count > 1 and not shared:
        raise ValueError(SHARED_RULE)
