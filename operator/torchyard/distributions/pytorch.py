"""``distribution.type: pytorch`` (the default): torch.distributed with the rank contract,
both launches (``process``: the launcher starts every rank; ``node``: the command once per
node, e.g. torchrun). Everything is :class:`~torchyard.distributions.base.DistributionType`'s
default; registered by ``torchyard.distributions``.
"""

from __future__ import annotations

from torchyard.distributions.base import DistributionType


class PyTorch(DistributionType):
    name = "pytorch"
