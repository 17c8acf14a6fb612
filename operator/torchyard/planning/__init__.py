"""Pure builders: names, the rank contract, and (with later issues) every manifest.

No I/O, no clock, no randomness: a function of the typed spec, returning dicts.
"""

from __future__ import annotations

from torchyard.planning import names
from torchyard.planning.rank import node_env, rank_envs

__all__ = ["names", "node_env", "rank_envs"]
