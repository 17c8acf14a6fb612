"""Azure ML's datastores as S3-compatible stores: ``Datastore.register_s3(ws, name,
bucket_name, secret_name)`` and ``Dataset.File.from_files(path=(datastore, 'birds/'))``.

A datastore here is a bucket of an S3-compatible store and the Secret of the workspace's
namespace that holds its endpoint and credentials (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION: the keys an s3:// input's ``secretRef`` names); a path
on it becomes the input ``s3://<bucket>/<path>`` with that Secret. It is registered on the
Workspace object, in this Python process (``ws.datastores``, ``Datastore.get``), not in
the cluster. Azure's own stores (blob containers, file shares, data lakes) have no
counterpart and raise with what to write instead. Tested in
tests/unit/sdk/test_azureml_datasets.py.
"""

from __future__ import annotations

import re
from typing import Any

from torchyard.inputs import uris
from torchyard.sdk.azureml.common import TorchyardSdkError

_SECRET = re.compile(r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
_INSTEAD = (
    "register an S3-compatible store instead: Datastore.register_s3(ws, 'birds_store', "
    "bucket_name='birds', secret_name='birds-store'), the Secret holding AWS_ENDPOINT_URL, "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
)


class Datastore:
    """~ ``azureml.core.Datastore``: a bucket and the Secret it is read with."""

    def __init__(self, workspace: Any, name: str, bucket_name: str, secret_name: str) -> None:
        uris.bucket_of(f"s3://{bucket_name}")  # a bucket's name, as S3 allows it
        if len(secret_name) > 253 or not _SECRET.match(secret_name):
            raise TorchyardSdkError(
                f"secret_name {secret_name!r} is not a Secret's name (a DNS-1123 subdomain)"
            )
        self.workspace = workspace
        self.name = name
        self.bucket_name = bucket_name
        self.secret_name = secret_name

    @staticmethod
    def register_s3(
        workspace: Any, datastore_name: str, bucket_name: str, secret_name: str
    ) -> Datastore:
        """Register the bucket ``bucket_name``, read with the Secret ``secret_name`` of the
        workspace's namespace, as ``datastore_name`` on ``workspace``."""
        try:
            store = Datastore(workspace, datastore_name, bucket_name, secret_name)
        except uris.InputError as err:
            raise TorchyardSdkError(f"datastore {datastore_name!r}: {err}") from None
        workspace.datastores[datastore_name] = store
        return store

    @staticmethod
    def get(workspace: Any, datastore_name: str) -> Datastore:
        found = workspace.datastores.get(datastore_name)
        if not isinstance(found, Datastore):
            raise TorchyardSdkError(
                f"no datastore {datastore_name!r} is registered on this Workspace object: "
                "datastores live in this Python process; Datastore.register_s3(...) it first"
            )
        return found

    @staticmethod
    def register_azure_blob_container(*args: Any, **kwargs: Any) -> Datastore:
        raise TorchyardSdkError(f"an Azure blob container has no counterpart here: {_INSTEAD}")

    register_azure_file_share = register_azure_blob_container
    register_azure_data_lake_gen2 = register_azure_blob_container

    def uri(self, path: str) -> str:
        """The s3:// URI of ``path`` in the bucket; InputError when it would leave it."""
        if path.startswith("/") or "\x00" in path:
            raise uris.InputError(
                f"path {path!r} on datastore {self.name!r} is relative to its bucket: "
                "write it without a leading '/' (e.g. 'birds/')"
            )
        uri = f"s3://{self.bucket_name}/{path}".rstrip("/")
        uris.bucket_of(uri)
        return uri

    def __repr__(self) -> str:
        return f"Datastore(name={self.name!r}, bucket_name={self.bucket_name!r})"
