"""The apiserver's refusals of a run's children, in one map: wait, fail, or retry.

Creating a run's children (its checkpoint claim, the MPI key Secret, the headless Service,
the node Pods) can be refused for what the user wrote, and no backoff fixes that. The
reconcile ("apply children", ``trainingruns``) hands such a refusal to :func:`of`, which
says what it means for the run:

- **wait** (:attr:`Refusal.fails` False): what the spec names may appear, or room may
  free up: the ServiceAccount (``spec.serviceAccountName``: the ServiceAccount admission
  plugin), the PriorityClass (``compute.priorityClassName``: the Priority plugin) or the
  namespace's ResourceQuota ("exceeded quota"). The run is Pending with ``Admitted``
  False, the reason and the apiserver's message, and is looked at again in
  :data:`WAIT_SECONDS`;
- **fail** (:attr:`Refusal.fails` True): the object is invalid (422), the request is bad
  (400), or an admission plugin or webhook of the namespace forbids it (403: Pod
  Security, a LimitRange, a quota that wants limits, a policy webhook). The run is Failed
  with reason InvalidSpec and the apiserver's message, naming the run's field where the
  message names a Pod's (:data:`FIELDS`);
- **retry** (None): anything else is the operator's own or passing (its RBAC, a
  conflict, a namespace being deleted, an apiserver that is unavailable): the caller
  raises it and the work queue retries with backoff, logging each try.

Called by ``trainingruns``; the checks before any child is created (an object the spec
names exists) are ``references``. Tested as a table in tests/unit/controller/test_refusals.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchyard import api, k8s

# How soon a run that waits for something the spec names is looked at again (no watch
# tells this operator that a ConfigMap, a claim or a PriorityClass appeared).
WAIT_SECONDS = 10.0
# The refusal of RBAC: the operator's own ServiceAccount lacks a grant (the chart's bug,
# not the user's): retried with backoff, and each try logged.
_RBAC = re.compile(r"\bcannot [a-z]+ resource \"")
# Where a Pod's field, in the apiserver's message, comes from in the TrainingRun.
FIELDS: tuple[tuple[str, str], ...] = (
    ("spec.nodeSelector", "spec.compute.nodeSelector (and spec.compute.pool)"),
    ("spec.tolerations", "spec.compute.tolerations"),
    ("spec.priorityClassName", "spec.compute.priorityClassName"),
    ("spec.serviceAccountName", "spec.serviceAccountName"),
    ("].resources", "spec.resources"),  # spec.containers[0].resources
    ("].command", "spec.command"),
    ("].env", "spec.env"),
    ("spec.volumes", "spec.source or spec.checkpoints"),
    ("spec.activeDeadlineSeconds", "spec.policy.activeDeadlineSeconds"),
    ("spec.terminationGracePeriodSeconds", "spec.policy.terminationGracePeriodSeconds"),
    ("spec.resources[storage]", "spec.checkpoints.size"),
    ("spec.storageClassName", "spec.checkpoints.storageClassName"),
)


@dataclass(frozen=True)
class Refusal:
    """What a refusal means for the run: its reason and message, and whether it fails."""

    reason: str
    message: str
    fails: bool

    @property
    def pending(self) -> tuple[str, str]:
        """(reason, message) for ``status`` (a run that waits)."""
        return self.reason, self.message


def of(err: k8s.ApiError, run: api.TrainingRun) -> Refusal | None:
    """What the apiserver's refusal ``err`` of one of ``run``'s children means for the
    run (see the module docstring); None: retry it with backoff."""
    message = err.message
    if err.status in (400, 422):
        return _fails(f"the apiserver refused a child of the run ({err.reason}): {message}")
    if err.status != 403 or _RBAC.search(message) or "being terminated" in message:
        return None
    if no_service_account(message):
        return Refusal(*service_account_missing(run), fails=False)
    if "no PriorityClass with name" in message:
        name = run.spec.compute.priority_class_name
        return Refusal(
            "PriorityClassNotFound",
            f"spec.compute.priorityClassName: no PriorityClass {name} in the cluster "
            f"({message}); create it or name one that exists (kubectl get priorityclasses); "
            "the run waits for it",
            fails=False,
        )
    if "exceeded quota" in message:
        return Refusal(
            "QuotaExceeded",
            f"the namespace's ResourceQuota has no room for the node Pods ({message}); the "
            "run waits until it has, or ask for fewer resources",
            fails=False,
        )
    if "PodSecurity" in message:
        return _fails(
            f"the namespace's Pod Security admission refused the node Pods ({message}); set "
            "spec.runAsUser (e.g. 1000, the curated images' user) to run them as non-root"
        )
    return _fails(f"the namespace's admission refused a child of the run: {message}")


def _fails(message: str) -> Refusal:
    fields = sorted({run_field for pod_field, run_field in FIELDS if pod_field in message})
    if fields:
        message = f"{message} (from {', '.join(fields)})"
    return Refusal("InvalidSpec", message, fails=True)


def no_service_account(message: str) -> bool:
    """The apiserver's ServiceAccount admission refused a Pod whose ServiceAccount is
    missing ("error looking up service account NS/NAME: serviceaccount "NAME" not found")."""
    text = message.lower()
    return "service account" in text and "not found" in text


def service_account_missing(run: api.TrainingRun) -> tuple[str, str]:
    sa, ns = run.spec.service_account_name, run.namespace
    return (
        "ServiceAccountNotFound",
        f"the node Pods run as ServiceAccount {sa} (spec.serviceAccountName), which does not "
        f"exist in namespace {ns}: create it (kubectl create serviceaccount {sa} -n {ns}) "
        "or name one that exists; the run waits for it",
    )
