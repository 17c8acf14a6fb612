"""Azure ML's file datasets as a run's inputs: ``Dataset.File.from_files(path)``,
``dataset.as_named_input('birds').as_mount()`` (or ``.as_download()``) passed among a
``ScriptRunConfig``'s arguments, as the guide's tip writes it.

A dataset is a URI torchyard can fetch or mount (``https://`` with ``sha256=``,
``model://<model>/<version>``, ``pvc://<claim>[/subpath]``, ``s3://<bucket>[/prefix]``,
``hf://<org>/<repo>[@revision]``), or a path on a ``Datastore`` (an S3-compatible bucket
and its Secret: ``s3://<bucket>/<path>`` with ``secretRef``). The argument an input
becomes is ``$TORCHYARD_INPUT_<NAME>``, which the launcher turns into the input's folder
in each process; ``ScriptRunConfig`` collects the inputs among its arguments into the
TrainingRun's ``spec.inputs`` (``experiments.run_spec``). Tested in
tests/unit/sdk/test_azureml_datasets.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from torchyard import api
from torchyard.inputs.uris import InputError, env_name
from torchyard.sdk.azureml.common import TorchyardSdkError
from torchyard.sdk.azureml.datastores import Datastore


class FileDataset:
    """Files at a URI (~ ``azureml.data.FileDataset``), with optional include patterns."""

    def __init__(
        self,
        uri: str,
        sha256: str | None = None,
        include: list[str] | None = None,
        secret_ref: str | None = None,
    ):
        self.uri = uri
        self.sha256 = sha256
        self.include = list(include or [])
        self.secret_ref = secret_ref  # a datastore's Secret

    def as_named_input(self, name: str) -> NamedInput:
        """The dataset as the run's input ``name`` (TORCHYARD_INPUT_<NAME>)."""
        return NamedInput(self, name)

    def as_mount(self, path_on_compute: str | None = None) -> InputArgument:
        raise TorchyardSdkError(
            "name the input first: dataset.as_named_input('birds').as_mount() (its folder "
            "is TORCHYARD_INPUT_BIRDS in every process)"
        )

    as_download = as_mount


class NamedInput:
    """A dataset with its input name (``as_named_input``)."""

    def __init__(self, dataset: FileDataset, name: str) -> None:
        self.dataset = dataset
        self.name = name

    def as_mount(self, path_on_compute: str | None = None) -> InputArgument:
        """Read-only, the cached copy (``path_on_compute``: where; default
        /torchyard/inputs/<name>)."""
        return InputArgument(self, "mount", path_on_compute)

    def as_download(self, path_on_compute: str | None = None) -> InputArgument:
        """A writable copy in each node Pod."""
        return InputArgument(self, "download", path_on_compute)


class InputArgument(str):
    """What ``as_mount()``/``as_download()`` give: the argument ``$TORCHYARD_INPUT_<NAME>``
    (a ``str``, so it goes into ``arguments`` as Azure ML's does), carrying its input."""

    input: api.Input

    def __new__(cls, named: NamedInput, mode: str, path: str | None) -> InputArgument:
        dataset = named.dataset
        fields: dict[str, Any] = {"name": named.name, "uri": dataset.uri, "mode": mode}
        if path is not None:
            fields["path"] = path
        if dataset.sha256 is not None:
            fields["sha256"] = dataset.sha256
        if dataset.include:
            fields["include"] = dataset.include
        if dataset.secret_ref is not None:
            fields["secretRef"] = dataset.secret_ref
        try:
            parsed = api.Input.model_validate(fields)
        except ValidationError as err:
            problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
            raise TorchyardSdkError(f"input {named.name!r}: {problems}") from None
        arg = super().__new__(cls, "$" + env_name(parsed.name))
        arg.input = parsed
        return arg


def _plain(validate: bool, partition_format: str | None, is_file: bool) -> None:
    if not validate:
        raise TorchyardSdkError(
            "validate=False has no meaning here: every input is checked when it is "
            "fetched (its sha256, or the model's manifest); leave validate out"
        )
    if partition_format is not None or is_file:
        raise TorchyardSdkError(
            "partition_format and is_file have no meaning here: an input is a folder; "
            "use include=[...] patterns to keep some of its files"
        )


class _File:
    @staticmethod
    def from_files(
        path: Any,
        validate: bool = True,
        partition_format: str | None = None,
        is_file: bool = False,
        *,
        sha256: str | None = None,
        include: list[str] | None = None,
    ) -> FileDataset:
        """~ ``Dataset.File.from_files``: ``path`` is one URI or one (datastore, path);
        ``sha256`` pins an https:// file; ``include``: patterns of the files to keep."""
        if isinstance(path, list) and len(path) == 1 and isinstance(path[0], tuple):
            path = path[0]
        if isinstance(path, tuple) and len(path) == 2 and not isinstance(path[0], str):
            return _on_datastore(path, validate, partition_format, is_file, sha256, include)
        if isinstance(path, (list, tuple)):
            if len(path) != 1:
                raise TorchyardSdkError("from_files takes one URI here (an input is one folder)")
            path = path[0]
        _plain(validate, partition_format, is_file)
        return FileDataset(str(path), sha256, include)


def _on_datastore(
    where: tuple[Any, Any],
    validate: bool,
    partition_format: str | None,
    is_file: bool,
    sha256: str | None,
    include: list[str] | None,
) -> FileDataset:
    """A path on a Datastore: ``s3://<bucket>/<path>`` read with its Secret."""
    store, path = where
    if not isinstance(store, Datastore) or not isinstance(path, str):
        raise TorchyardSdkError(
            "(datastore, path) takes a Datastore of Datastore.register_s3(...) and a path "
            "in its bucket, e.g. (datastore, 'birds/')"
        )
    _plain(validate, partition_format, is_file)
    try:
        uri = store.uri(path)
    except InputError as err:
        raise TorchyardSdkError(f"datastore {store.name!r}: {err}") from None
    return FileDataset(uri, sha256, include, store.secret_name)


class Dataset:
    """~ ``azureml.core.Dataset``: ``Dataset.File.from_files``."""

    File = _File


def inputs_of(arguments: list[Any]) -> list[api.Input]:
    """The inputs among a ScriptRunConfig's arguments, in order."""
    return [a.input for a in arguments if isinstance(a, InputArgument)]


__all__ = ["Dataset", "Datastore"]  # Datastore: defined in datastores, named here
