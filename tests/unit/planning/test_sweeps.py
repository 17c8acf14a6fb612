"""A Sweep's trial TrainingRuns and its ledger ConfigMap, as tables: the template with the
parameters appended to the command and set as variables, the name, labels, owner and
parameters annotation; the decision that stops a trial; the same inputs, the same
manifest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder
from torchyard import api
from torchyard.api import wire
from torchyard.planning import sweeps

SWEEP = SweepBuilder("hd", "ml").trial(
    TrainingRunBuilder("t")
    .command("python", "pytorch_train.py", "--num_epochs", "30")
    .env(DATA="/data")
    .gpus(1)
    .pool("a100")
)
PARAMS = {"learning_rate": 0.0031, "momentum": 0.95}
ARGS = ["--learning_rate", "0.0031", "--momentum", "0.95"]
ENV = {"TORCHYARD_PARAM_LEARNING_RATE": "0.0031", "TORCHYARD_PARAM_MOMENTUM": "0.95"}


def parsed(builder: SweepBuilder = SWEEP) -> api.Sweep:
    body = builder.obj()
    body["metadata"]["uid"] = "uid-hd"
    return api.parse_sweep(body)


def test_a_trial_is_the_template_with_its_parameters_as_arguments_and_variables() -> None:
    made = sweeps.trial(parsed(), 3, PARAMS, ARGS, ENV)
    assert made["metadata"]["name"] == "hd-t3"
    assert made["metadata"]["namespace"] == "ml"
    assert made["spec"]["command"] == [
        "python",
        "pytorch_train.py",
        "--num_epochs",
        "30",
        "--learning_rate",
        "0.0031",
        "--momentum",
        "0.95",
    ]
    assert made["spec"]["env"] == [
        {"name": "DATA", "value": "/data"},
        {"name": "TORCHYARD_PARAM_LEARNING_RATE", "value": "0.0031"},
        {"name": "TORCHYARD_PARAM_MOMENTUM", "value": "0.95"},
    ]
    assert made["spec"]["resources"]["gpusPerNode"] == 1
    assert made["spec"]["compute"]["pool"] == "a100"
    assert made["spec"]["suspend"] is False
    api.parse_trainingrun(made)  # a valid TrainingRun


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.labels", {wire.LABEL_SWEEP: "hd", wire.LABEL_TRIAL: "3"}),
        (
            "metadata.annotations",
            {wire.ANNOTATION_PARAMETERS: '{"learning_rate": 0.0031, "momentum": 0.95}'},
        ),
        (
            "metadata.ownerReferences",
            [
                {
                    "apiVersion": "torchyard.dev/v1alpha1",
                    "kind": "Sweep",
                    "name": "hd",
                    "uid": "uid-hd",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        ),
    ],
)
def test_a_trial_names_its_sweep_index_parameters_and_owner(path: str, value: Any) -> None:
    node: Any = sweeps.trial(parsed(), 3, PARAMS, ARGS, ENV)
    for key in path.split("."):
        node = node[key]
    if isinstance(value, dict):
        assert {k: node[k] for k in value} == value
    else:
        assert node == value


def test_the_same_inputs_give_the_same_manifest() -> None:
    assert sweeps.trial(parsed(), 1, PARAMS, ARGS, ENV) == sweeps.trial(
        parsed(), 1, dict(reversed(PARAMS.items())), ARGS, ENV
    )


@pytest.mark.parametrize(
    ("decision", "annotations"),
    [
        (
            sweeps.Decision("stopped", "below the slack"),
            {
                wire.ANNOTATION_DECISION: "stopped",
                wire.ANNOTATION_DECISION_REASON: "below the slack",
            },
        ),
        (
            sweeps.Decision("canceled", "x" * 2000),
            {wire.ANNOTATION_DECISION: "canceled", wire.ANNOTATION_DECISION_REASON: "x" * 1024},
        ),
    ],
)
def test_a_decision_suspends_the_trial_and_says_why(
    decision: sweeps.Decision, annotations: dict[str, str]
) -> None:
    made = sweeps.decided(parsed(), 2, decision)
    assert made == {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "hd-t2", "namespace": "ml", "annotations": annotations},
        "spec": {"suspend": True},
    }
    assert sweeps.decision_of(made) == sweeps.Decision(
        decision.what, annotations[wire.ANNOTATION_DECISION_REASON]
    )


def test_a_promotion_resumes_the_trial_and_counts() -> None:
    made = sweeps.decided(parsed(), 2, sweeps.Decision("promoted", "top third", 1))
    assert made["spec"] == {"suspend": False}
    assert made["metadata"]["annotations"][wire.ANNOTATION_PROMOTIONS] == "1"
    assert sweeps.decision_of(made) == sweeps.Decision("promoted", "top third", 1)


@pytest.mark.parametrize(
    ("labels", "annotations", "index", "decision"),
    [
        ({wire.LABEL_TRIAL: "12"}, {}, 12, None),
        ({wire.LABEL_TRIAL: "x"}, {wire.ANNOTATION_DECISION: "shelved"}, None, None),
        (
            {},
            {wire.ANNOTATION_DECISION: "promoted", wire.ANNOTATION_PROMOTIONS: "2"},
            None,
            sweeps.Decision("promoted", "", 2),
        ),
        (
            {},
            {wire.ANNOTATION_DECISION: "paused", wire.ANNOTATION_PROMOTIONS: "-1"},
            None,
            sweeps.Decision("paused", "", 0),
        ),
        ({}, {wire.ANNOTATION_DECISION: "canceled"}, None, sweeps.Decision("canceled", "")),
    ],
)
def test_index_and_decision_read_back(
    labels: dict[str, str],
    annotations: dict[str, str],
    index: int | None,
    decision: sweeps.Decision | None,
) -> None:
    run = {"metadata": {"labels": labels, "annotations": annotations}}
    assert sweeps.index_of(run) == index
    assert sweeps.decision_of(run) == decision


def test_the_ledger_is_a_configmap_owned_by_the_sweep_with_its_keys_in_order() -> None:
    made = sweeps.ledger(parsed(), {"t10": "{}", "t2": json.dumps({"state": "Running"})})
    assert made["metadata"]["name"] == "hd-trials"
    assert made["metadata"]["labels"][wire.LABEL_SWEEP] == "hd"
    assert made["metadata"]["ownerReferences"][0]["uid"] == "uid-hd"
    assert list(made["data"]) == ["t10", "t2"]


def test_the_selector_finds_a_sweeps_trials() -> None:
    assert sweeps.selector("hd") == f"{wire.LABEL_SWEEP}=hd"


INPUTS = [
    {"name": "base", "uri": "model://birds"},  # no version: pinned
    {"name": "fixed", "uri": "model://birds/2"},  # a version of its own
    {"name": "named", "uri": "model://birds", "revision": "1"},
    {"name": "data", "uri": "pvc://shots"},
]


def test_pinning_gives_each_trial_the_version_only_where_the_template_names_none() -> None:
    swept = parsed(
        SweepBuilder("hd", "ml").trial(TrainingRunBuilder("t").with_("spec.inputs", INPUTS))
    )
    versions = {"base": "3", "fixed": "9", "named": "9", "data": "9"}
    made = sweeps.trial(sweeps.pinned(swept, versions), 0, PARAMS, ARGS, ENV)
    revisions = {i["name"]: i.get("revision") for i in made["spec"]["inputs"]}
    assert revisions == {"base": "3", "fixed": None, "named": "1", "data": None}
    assert [i["uri"] for i in made["spec"]["inputs"]] == [i["uri"] for i in INPUTS]
    assert sweeps.trial_versions(made, ["base"]) == {"base": "3"}
    assert sweeps.trial_versions(made, ["base", "named"]) == {"base": "3", "named": "1"}
    assert sweeps.pinned(swept, {}) is swept and sweeps.pinned(swept, {"other": "1"}) is swept
    bare = sweeps.trial(swept, 0, PARAMS, ARGS, ENV)
    assert sweeps.trial_versions(bare, ["base"]) == {}
