"""What an input's URI names, and the key of its cache entry: the face of the schemes.

One parser for every side that reads an input: the API (a spec's input is refused when
:func:`parse` refuses it), planning (the fetch Job, the mounts), the fetch Job itself and
local mode. The schemes are registered variants (``inputs.schemes``), one module each:
``https://`` and ``http://`` (``web``: a file or an archive, pinned by its sha256),
``model://<name>/<version>`` (``models``: a ModelVersion of the torchyard registry),
``pvc://<claim>[/subpath]`` (``pvc``: a claim mounted read-only, nothing fetched),
``s3://<bucket>[/prefix]`` (``s3``: the objects under a prefix of an S3-compatible store)
and ``hf://[datasets/]<org>/<repo>[@revision]`` (``hf``: a repository of the Hugging Face
Hub). This module re-exports what the other layers use of them; the cache key is
``inputs.base``'s. Standard library only; tested in tests/unit/inputs/test_uris.py.
"""

from __future__ import annotations

from torchyard.inputs.base import (
    FORMAT,
    NAME,
    SHA256,
    InputError,
    Source,
    env_name,
    patterns_valid,
    scheme_of,
)
from torchyard.inputs.hf import COMMIT, DEFAULT_HUB_REVISION, HubRepo, hub_repo_of
from torchyard.inputs.models import model_of
from torchyard.inputs.pvc import claim_of
from torchyard.inputs.s3 import S3_KEY_MAX_BYTES, S3_PREFIX_REFUSED, bucket_of
from torchyard.inputs.schemes import cache_key, parse

__all__ = [
    "COMMIT",
    "DEFAULT_HUB_REVISION",
    "FORMAT",
    "NAME",
    "S3_KEY_MAX_BYTES",
    "S3_PREFIX_REFUSED",
    "SHA256",
    "HubRepo",
    "InputError",
    "Source",
    "bucket_of",
    "cache_key",
    "claim_of",
    "env_name",
    "hub_repo_of",
    "model_of",
    "parse",
    "patterns_valid",
    "scheme_of",
]
