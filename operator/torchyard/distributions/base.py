"""What a distribution type decides (``spec.distribution.type``), and the defaults.

A type is a :class:`DistributionType` registered with :func:`torchyard.distributions.register`;
the callers ask the run's type (``distributions.of(spec)``) instead of branching on its
name: the API (its rules), ``planning.rank`` (the node's variables), ``planning.pods`` (the
launcher's variables and the Pod's extra ports, mounts and volumes), the controller (a
per-run key Secret) and local mode (how many launchers it starts). The defaults are
PyTorch's: a type overrides only what it does differently.

Below the API in the layers: a type reads the spec through :class:`Spec` (which the API's
``Distribution`` model satisfies) and gets the names of the run's objects from the planner
(:class:`Place`), so the API can validate a run against the registered types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torchyard.launch.contract import NODE_LAUNCHER
from torchyard.variants import Rule as Rule  # re-exported: the types write their rules with it


class Spec(Protocol):
    """The fields of ``spec.distribution`` a type reads (``api.Distribution``)."""

    @property
    def type(self) -> str: ...
    @property
    def launch(self) -> str: ...
    @property
    def node_count(self) -> int: ...
    @property
    def process_count_per_node(self) -> int: ...
    @property
    def master_port(self) -> int: ...
    @property
    def implementation(self) -> str | None: ...
    @property
    def mpirun_args(self) -> Sequence[str] | None: ...
    @property
    def world_size(self) -> int: ...


@dataclass(frozen=True)
class Place:
    """Where a run's node launchers run, as the planner names it (Pods; local mode has
    none): ``hosts`` the node Pods' DNS names, node 0 first, ``domain`` their subdomain
    (the headless Service), ``key_secret`` the run's key Secret (types with ``needs_key``)."""

    hosts: tuple[str, ...]
    domain: str
    key_secret: str


@dataclass(frozen=True)
class PodParts:
    """What a type adds to each node Pod: container ports and volume mounts, Pod volumes."""

    ports: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()


class DistributionType:
    """A distribution type; the defaults are what a type without special needs does
    (PyTorch's: one launcher per node, each starting its ranks with the rank contract)."""

    name: str = ""
    # the type's rules (CEL for the CRD, the same check in Python): every registered
    # type's rules apply to every run (a rule may say a field belongs to its type only)
    rules: tuple[Rule[Spec], ...] = ()
    # The launcher class that runs each node (a key of ``launch.main.LAUNCHERS``, named in
    # ``launch.contract``): the planner puts it in the launcher's TORCHYARD_DISTRIBUTION
    launcher: str = NODE_LAUNCHER
    # True: the controller creates a random key Secret per run before its Pods
    # (``Place.key_secret``), owned by the run and never changed
    needs_key: bool = False
    # True: every node Pod gets a DNS name through the run's headless Service (MPI's
    # hostfile names them all); False: node 0 only (MASTER_ADDR), so the Service's
    # Endpoints and EndpointSlice change with one Pod, not with each Pod of a large gang
    # while it starts (``planning.pods.service``)
    names_every_node: bool = False

    def node_env(self, spec: Spec, env: dict[str, str]) -> dict[str, str]:
        """A node launcher's rank contract (``planning.rank.node_env``), as the type has it."""
        return env

    def launcher_env(self, spec: Spec, place: Place | None) -> dict[str, str]:
        """The launcher's own variables besides the rank contract and the launcher class
        (:attr:`launcher`; ``place`` None: local mode)."""
        return {}

    def pod_parts(self, spec: Spec, place: Place) -> PodParts:
        return PodParts()

    def local_launchers(self, spec: Spec, path: str) -> tuple[int, str | None]:
        """How many node launchers local mode starts on this machine (``path``: the
        launchers' PATH), and what to tell the user about it (None: nothing)."""
        return spec.node_count, None
