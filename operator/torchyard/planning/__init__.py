"""Pure builders: names, the rank contract, and every manifest torchyard applies.

No I/O, no clock, no randomness: a function of the typed spec, returning dicts. The
modules: ``names`` (every object's name), ``rank`` (the rank contract), ``pods`` (a run's
headless Service and node Pods), ``admission`` (does a gang fit its pool),
``environments`` (build hashes and build Jobs), ``models`` (a promotion's metadata and
the ModelVersion). Called by the controller, local mode and the SDK's dry run.
"""

from __future__ import annotations

from torchyard.planning import names
from torchyard.planning.rank import node_env, rank_envs

__all__ = ["names", "node_env", "rank_envs"]
