"""A device-plugin stand-in for the real test node: a few ``nvidia.com/gpu`` that go
through the kubelet's device manager for real, as NVIDIA's device plugin's do.

It speaks the kubelet's device-plugin gRPC API ``v1beta1`` (Kubernetes' documented
``deviceplugin/v1beta1`` API: the ``Registration`` service that the kubelet serves on
``kubelet.sock``, the ``DevicePlugin`` service that a plugin serves on its own socket in
the same folder):

- it serves ``DevicePlugin`` on ``<plugin dir>/torchyard-gpu.sock``, then calls
  ``Registration.Register`` (version ``v1beta1``, that socket's name, ``nvidia.com/gpu``);
- ``ListAndWatch`` streams ``count`` healthy devices ``GPU-<uuid>`` (the same ids for the
  same node name on every start, so the kubelet's checkpoint stays valid);
- ``Allocate`` answers each container with ``NVIDIA_VISIBLE_DEVICES=<ids, comma-separated>``,
  what NVIDIA's plugin sets with its default (environment variable) strategy;
- ``GetPreferredAllocation`` prefers the ids that must be included, then the lowest;
  ``PreStartContainer`` does nothing (it is not asked for);
- when the kubelet restarts it empties the folder and creates ``kubelet.sock`` anew: the
  stand-in then serves a new socket and registers again.

The kubelet finds plugins in ``/var/lib/kubelet/device-plugins`` whatever its
``--root-dir`` (the path is a constant of the API), so that is the default folder.

The messages are built here from a ``FileDescriptorProto`` written from the documented
API (same package, message names and field numbers), so no generated code and no
``protoc``; grpcio's generic handlers serve them. The module imports only the standard
library, grpcio and protobuf (nothing from ``tests``): ``tests/cluster/realnode.py`` runs
it as a script (``command()``) once the kubelet is Ready and stops it with SIGTERM, on
which it removes its socket. It writes what it did (devices, registrations, watches) to a
status file that ``realnode.py`` waits on.

Tested by ``tests/unit/cluster/test_deviceplugin.py`` (messages, validation, and a fake
kubelet over real gRPC) and ``tests/node/test_gpus.py`` (the real kubelet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

API_VERSION = "v1beta1"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # the API's DevicePluginPath
KUBELET_SOCKET = "kubelet.sock"
RESOURCE = "nvidia.com/gpu"
ENDPOINT = "torchyard-gpu.sock"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
HEALTHY = "Healthy"
DEFAULT_COUNT = 4
MAX_COUNT = 16
# sockaddr_un's sun_path holds 108 bytes, the last one a NUL
MAX_SOCKET_PATH = 107
# the ids of one node are the same on every start (uuid5 of the node name and index)
ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "deviceplugin.torchyard.dev")

SCRIPT = Path(__file__).resolve()  # realnode.py runs this file as a program

log = logging.getLogger("torchyard.deviceplugin")


class DeviceError(ValueError):
    """Bad input to the stand-in (arguments, or a request naming devices it does not
    have); the message says what to use instead."""


class RegistrationError(RuntimeError):
    """The kubelet did not accept the registration (yet): retried with a back-off."""


# -- the API's messages, from the documented v1beta1 API ------------------------------

_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
}
# message -> [(field, number, type, repeated)]; a type not in _SCALARS is a message of
# this package, "map" a map<string, string>
_FIELDS: dict[str, list[tuple[str, int, str, bool]]] = {
    "DevicePluginOptions": [
        ("pre_start_required", 1, "bool", False),
        ("get_preferred_allocation_available", 2, "bool", False),
    ],
    "RegisterRequest": [
        ("version", 1, "string", False),
        ("endpoint", 2, "string", False),
        ("resource_name", 3, "string", False),
        ("options", 4, "DevicePluginOptions", False),
    ],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, "Device", True)],
    "TopologyInfo": [("nodes", 1, "NUMANode", True)],
    "NUMANode": [("ID", 1, "int64", False)],
    "Device": [
        ("ID", 1, "string", False),
        ("health", 2, "string", False),
        ("topology", 3, "TopologyInfo", False),
    ],
    "PreStartContainerRequest": [("devices_ids", 1, "string", True)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [
        ("container_requests", 1, "ContainerPreferredAllocationRequest", True)
    ],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, "string", True),
        ("must_include_deviceIDs", 2, "string", True),
        ("allocation_size", 3, "int32", False),
    ],
    "PreferredAllocationResponse": [
        ("container_responses", 1, "ContainerPreferredAllocationResponse", True)
    ],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, "string", True)],
    "AllocateRequest": [("container_requests", 1, "ContainerAllocateRequest", True)],
    "ContainerAllocateRequest": [("devices_ids", 1, "string", True)],
    "CDIDevice": [("name", 1, "string", False)],
    "AllocateResponse": [("container_responses", 1, "ContainerAllocateResponse", True)],
    "ContainerAllocateResponse": [
        ("envs", 1, "map", True),
        ("mounts", 2, "Mount", True),
        ("devices", 3, "DeviceSpec", True),
        ("annotations", 4, "map", True),
        ("cdi_devices", 5, "CDIDevice", True),
    ],
    "Mount": [
        ("container_path", 1, "string", False),
        ("host_path", 2, "string", False),
        ("read_only", 3, "bool", False),
    ],
    "DeviceSpec": [
        ("container_path", 1, "string", False),
        ("host_path", 2, "string", False),
        ("permissions", 3, "string", False),
    ],
}
# service -> [(method, request, response, server streaming)]
_SERVICES: dict[str, list[tuple[str, str, str, bool]]] = {
    "Registration": [("Register", "RegisterRequest", "Empty", False)],
    "DevicePlugin": [
        ("GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
        ("ListAndWatch", "Empty", "ListAndWatchResponse", True),
        (
            "GetPreferredAllocation",
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
            False,
        ),
        ("Allocate", "AllocateRequest", "AllocateResponse", False),
        ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
    ],
}


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The ``v1beta1`` API as a proto3 file descriptor (pure)."""
    label = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="torchyard/deviceplugin/v1beta1.proto", package=API_VERSION, syntax="proto3"
    )
    for name, fields in _FIELDS.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(
                name=field_name,
                number=number,
                label=label.LABEL_REPEATED if repeated else label.LABEL_OPTIONAL,
            )
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            elif kind == "map":  # map<string, string>: a nested KeyEntry message
                entry = message.nested_type.add(name=_map_entry(field_name))
                entry.options.map_entry = True
                for key, key_number in (("key", 1), ("value", 2)):
                    entry.field.add(
                        name=key, number=key_number, type=_SCALARS["string"],
                        label=label.LABEL_OPTIONAL,
                    )  # fmt: skip
                field.type = label.TYPE_MESSAGE
                field.type_name = f".{API_VERSION}.{name}.{entry.name}"
            else:
                field.type = label.TYPE_MESSAGE
                field.type_name = f".{API_VERSION}.{kind}"
    for service_name, methods in _SERVICES.items():
        service = proto.service.add(name=service_name)
        for method, request, response, streaming in methods:
            service.method.add(
                name=method,
                input_type=f".{API_VERSION}.{request}",
                output_type=f".{API_VERSION}.{response}",
                server_streaming=streaming,
            )
    return proto


def _map_entry(field: str) -> str:
    # protoc's name for a map field's entry: "envs" -> "EnvsEntry", "cdi_x" -> "CdiXEntry"
    return "".join(part[:1].upper() + part[1:] for part in field.split("_")) + "Entry"


def _message_classes() -> dict[str, type[Message]]:
    pool = descriptor_pool.DescriptorPool()  # our own: never the process-wide default
    pool.Add(file_descriptor())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{API_VERSION}.{name}"))
        for name in _FIELDS
    }


MESSAGES = _message_classes()


def new(name: str, **fields: Any) -> Message:
    """A ``v1beta1`` message, e.g. ``new("Device", ID="GPU-...", health="Healthy")``."""
    try:
        cls = MESSAGES[name]
    except KeyError:
        raise DeviceError(
            f"no message {name!r} in {API_VERSION}: use one of {sorted(MESSAGES)}"
        ) from None
    return cls(**fields)


def method_path(service: str, method: str) -> str:
    """The gRPC path of a method, e.g. ``/v1beta1.Registration/Register``."""
    return f"/{API_VERSION}.{service}/{method}"


def _codec(service: str, method: str) -> tuple[type[Message], type[Message]]:
    for name, request, response, _ in _SERVICES[service]:
        if name == method:
            return MESSAGES[request], MESSAGES[response]
    raise DeviceError(f"no method {method!r} in {API_VERSION}.{service}")


# -- pure behaviour: names, ids, allocations ------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_SOCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}\.sock$")


def validate_resource(name: str) -> str:
    """An extended resource name the kubelet accepts from a plugin (``vendor.com/thing``)."""
    domain, _, short = name.partition("/")
    if (
        not short
        or len(domain) > 253
        or not _DNS_SUBDOMAIN.fullmatch(domain)
        or "." not in domain
        or not _QUALIFIED_NAME.fullmatch(short)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or short.startswith("requests.")
    ):
        raise DeviceError(
            f"resource name {name!r}: use an extended resource name '<vendor domain>/<name>' "
            f"outside kubernetes.io, e.g. {RESOURCE}"
        )
    return name


def validate_endpoint(name: str) -> str:
    """The plugin's socket: a plain file name in the plugin folder, never kubelet.sock."""
    if name == KUBELET_SOCKET or not _SOCKET_NAME.fullmatch(name) or ".." in name:
        raise DeviceError(
            f"endpoint {name!r}: use a plain socket file name ending in .sock (no '/', no "
            f"'..', not {KUBELET_SOCKET}), e.g. {ENDPOINT}"
        )
    return name


def validate_plugin_dir(path: Path, endpoint: str = ENDPOINT) -> Path:
    if not path.is_absolute() or ".." in path.parts:
        raise DeviceError(
            f"plugin folder {str(path)!r}: use an absolute path without '..', e.g. {PLUGIN_DIR}"
        )
    longest = max(len(os.fsencode(path / n)) for n in (endpoint, KUBELET_SOCKET))
    if longest > MAX_SOCKET_PATH:
        raise DeviceError(
            f"plugin folder {str(path)!r}: a socket path there is {longest} bytes, over the "
            f"{MAX_SOCKET_PATH} a unix socket allows: use a shorter folder"
        )
    return path


def validate_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise DeviceError(f"device count {count!r}: use a whole number from 1 to {MAX_COUNT}")
    return count


_DEVICE_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$")  # the API allows 63 characters


def validate_devices(devices: Sequence[str]) -> list[str]:
    bad = [d for d in devices if not isinstance(d, str) or not _DEVICE_ID.fullmatch(d)]
    if not devices or bad or len(set(devices)) != len(devices):
        raise DeviceError(
            f"devices {list(devices)!r}: pass at least one id, each distinct, at most 63 "
            "letters, digits, '-', '_' or '.' (e.g. from device_ids())"
        )
    return list(devices)


def device_ids(node: str, count: int = DEFAULT_COUNT) -> list[str]:
    """``count`` GPU ids shaped like NVIDIA's (``GPU-<uuid>``), the same for ``node`` on
    every start."""
    if not _DNS_LABEL.fullmatch(node):
        raise DeviceError(f"node name {node!r}: use a DNS-1123 label, e.g. real-0")
    validate_count(count)
    return [f"GPU-{uuid.uuid5(ID_NAMESPACE, f'{node}/{index}')}" for index in range(count)]


def _checked(advertised: Sequence[str], ids: Sequence[str], what: str) -> list[str]:
    unknown = [i for i in ids if i not in advertised]
    if unknown:
        raise DeviceError(
            f"{what}: unknown device ids {unknown}; this plugin has {list(advertised)}"
        )
    if len(set(ids)) != len(ids):
        raise DeviceError(f"{what}: a device id appears twice in {list(ids)}")
    return list(ids)


def allocate(advertised: Sequence[str], request: Message) -> Message:
    """``AllocateResponse`` for ``request``: each container sees its devices' ids in
    ``NVIDIA_VISIBLE_DEVICES``, in the order the kubelet gave them."""
    responses = []
    for index, container in enumerate(request.container_requests):  # type: ignore[attr-defined]
        ids = _checked(advertised, container.devices_ids, f"container request {index}")
        if not ids:
            raise DeviceError(f"container request {index}: no device ids to allocate")
        responses.append(new("ContainerAllocateResponse", envs={VISIBLE_DEVICES: ",".join(ids)}))
    return new("AllocateResponse", container_responses=responses)


def preferred(advertised: Sequence[str], request: Message) -> Message:
    """``PreferredAllocationResponse``: the ids that must be included, then the available
    ones in advertised order, ``allocation_size`` in all."""
    responses = []
    for index, container in enumerate(request.container_requests):  # type: ignore[attr-defined]
        what = f"container request {index}"
        available = _checked(advertised, container.available_deviceIDs, what)
        must = _checked(available, container.must_include_deviceIDs, what)
        size = container.allocation_size
        if not len(must) <= size <= len(available):
            raise DeviceError(
                f"{what}: allocation_size {size} must be between the {len(must)} ids that "
                f"must be included and the {len(available)} available"
            )
        rest = [i for i in advertised if i in available and i not in must]
        chosen = must + rest[: size - len(must)]
        responses.append(new("ContainerPreferredAllocationResponse", deviceIDs=chosen))
    return new("PreferredAllocationResponse", container_responses=responses)


def list_response(devices: Sequence[str]) -> Message:
    return new(
        "ListAndWatchResponse", devices=[new("Device", ID=i, health=HEALTHY) for i in devices]
    )


def register_request(endpoint: str = ENDPOINT, resource: str = RESOURCE) -> Message:
    return new(
        "RegisterRequest",
        version=API_VERSION,
        endpoint=validate_endpoint(endpoint),
        resource_name=validate_resource(resource),
        options=new("DevicePluginOptions", get_preferred_allocation_available=True),
    )


# -- the gRPC side --------------------------------------------------------------------


def socket_identity(path: Path) -> tuple[int, int, int] | None:
    """Which socket file ``path`` is now (None: none, or not a socket): a socket that was
    removed and created again is another one."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def remove_socket(path: Path) -> bool:
    """Remove ``path`` if it is a socket (never a file or a link someone put there)."""
    if socket_identity(path) is None:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


class StandIn:
    """Serves ``DevicePlugin`` on ``plugin_dir/endpoint`` and keeps it registered with the
    kubelet at ``plugin_dir/kubelet.sock``: ``start()``, ``run(stop)``, ``stop()``."""

    def __init__(
        self,
        devices: Sequence[str],
        *,
        plugin_dir: Path = PLUGIN_DIR,
        endpoint: str = ENDPOINT,
        resource: str = RESOURCE,
        status_file: Path | None = None,
        register_timeout: float = 10.0,
    ) -> None:
        self.devices = validate_devices(devices)
        self.endpoint = validate_endpoint(endpoint)
        self.plugin_dir = validate_plugin_dir(plugin_dir, self.endpoint)
        self.resource = validate_resource(resource)
        self.status_file = status_file
        self.register_timeout = register_timeout
        self.registrations = 0
        self.watches = 0
        self.allocations: list[list[str]] = []
        self._server: grpc.Server | None = None
        self._serving: tuple[int, int, int] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    @property
    def socket(self) -> Path:
        return self.plugin_dir / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    # -- the DevicePlugin service -----------------------------------------------------

    def _options(self, request: Message, context: grpc.ServicerContext) -> Message:
        return new("DevicePluginOptions", get_preferred_allocation_available=True)

    def _list_and_watch(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        yield list_response(self.devices)
        with self._lock:
            self.watches += 1
        self._write_status()
        log.info("the kubelet watches %d devices", len(self.devices))
        # the devices never change: hold the stream open until the kubelet or we end it
        while context.is_active() and not self._stopping.wait(0.2):
            pass

    def _preferred(self, request: Message, context: grpc.ServicerContext) -> Message:
        try:
            return preferred(self.devices, request)
        except DeviceError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise  # abort raises; this keeps type checkers and readers sure

    def _allocate(self, request: Message, context: grpc.ServicerContext) -> Message:
        try:
            response = allocate(self.devices, request)
        except DeviceError as err:
            log.warning("refused an allocation: %s", err)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise
        granted = [list(c.devices_ids) for c in request.container_requests]  # type: ignore[attr-defined]
        with self._lock:
            self.allocations += granted
        self._write_status()
        log.info("allocated %s", granted)
        return response

    def _pre_start(self, request: Message, context: grpc.ServicerContext) -> Message:
        return new("PreStartContainerResponse")

    def _handler(self) -> grpc.GenericRpcHandler:
        behaviour: dict[str, Callable[..., Any]] = {
            "GetDevicePluginOptions": self._options,
            "ListAndWatch": self._list_and_watch,
            "GetPreferredAllocation": self._preferred,
            "Allocate": self._allocate,
            "PreStartContainer": self._pre_start,
        }
        handlers = {}
        for method, _, _, streaming in _SERVICES["DevicePlugin"]:
            request, response = _codec("DevicePlugin", method)
            make = (
                grpc.unary_stream_rpc_method_handler
                if streaming
                else grpc.unary_unary_rpc_method_handler
            )
            handlers[method] = make(
                behaviour[method],
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
        return grpc.method_handlers_generic_handler(f"{API_VERSION}.DevicePlugin", handlers)

    # -- serving and registering ------------------------------------------------------

    def serve(self) -> None:
        """(Re)start the DevicePlugin server on a fresh socket."""
        self._stop_server()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        try:
            st = self.socket.lstat()
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise DeviceError(
                    f"{self.socket} exists and is not a socket: remove it, or pass another "
                    "endpoint name"
                )
            self.socket.unlink()  # a socket left by an earlier stand-in
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="deviceplugin"),
            handlers=[self._handler()],
        )
        if not server.add_insecure_port(f"unix://{self.socket}"):
            raise DeviceError(f"cannot listen on {self.socket}: is the folder writable?")
        server.start()
        self._server = server
        self._serving = socket_identity(self.socket)

    def register(self) -> None:
        """Ask the kubelet to use this plugin (it dials back, then calls ListAndWatch)."""
        request_cls, response_cls = _codec("Registration", "Register")
        # a fresh connection each time: a restarted kubelet serves a new socket
        options = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}", options=options) as channel:
            call = channel.unary_unary(
                method_path("Registration", "Register"),
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            try:
                call(register_request(self.endpoint, self.resource), timeout=self.register_timeout)
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, grpc.Call) else None
                details = err.details() if isinstance(err, grpc.Call) else str(err)
                raise RegistrationError(
                    f"registering {self.resource} at {self.kubelet_socket}: {code}: {details}"
                ) from None
        with self._lock:
            self.registrations += 1
        self._write_status()
        log.info(
            "registered %s (%d devices) with the kubelet (registration %d)",
            self.resource, len(self.devices), self.registrations,
        )  # fmt: skip

    def start(self) -> StandIn:
        self._stopping.clear()
        self.serve()
        self._write_status()
        return self

    def run(self, stop: threading.Event, poll: float = 0.1) -> None:
        """Keep registered until ``stop`` is set: register whenever the kubelet's socket
        is new (first start, kubelet restart), serve again when ours was removed."""
        registered_with: tuple[int, int, int] | None = None
        delay, next_try = poll, 0.0
        while not stop.is_set():
            if self._server is None or socket_identity(self.socket) != self._serving:
                log.info("%s is gone (the kubelet restarted?): serving it again", self.socket)
                self.serve()
                registered_with = None
            kubelet = socket_identity(self.kubelet_socket)
            if kubelet is not None and kubelet != registered_with and time.monotonic() >= next_try:
                try:
                    self.register()
                except RegistrationError as err:
                    log.warning("%s; trying again in %.1fs", err, delay)
                    next_try = time.monotonic() + delay
                    delay = min(delay * 2, 2.0)
                else:
                    registered_with = kubelet
                    delay = poll
            stop.wait(poll)

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        if self._serving is not None and socket_identity(self.socket) == self._serving:
            remove_socket(self.socket)
        self._serving = None

    def stop(self) -> None:
        """Stop serving and remove the socket; safe to call twice."""
        self._stopping.set()
        self._stop_server()
        self._write_status()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "pid": os.getpid(),
                "resource": self.resource,
                "socket": str(self.socket),
                "devices": list(self.devices),
                "serving": self._server is not None,
                "registrations": self.registrations,
                "watches": self.watches,
                "allocations": [list(a) for a in self.allocations],
            }

    def _write_status(self) -> None:
        if self.status_file is None:
            return
        with self._write_lock:  # one writer at a time; readers see whole files (rename)
            text = json.dumps(self.status(), indent=1)
            partial = self.status_file.with_name(self.status_file.name + ".partial")
            partial.write_text(text)
            os.replace(partial, self.status_file)


# -- as a program -------------------------------------------------------------------


def command(
    *,
    node: str,
    count: int = DEFAULT_COUNT,
    status_file: Path,
    plugin_dir: Path = PLUGIN_DIR,
    python: str = sys.executable,
) -> list[str]:
    """The command line that runs the stand-in for ``node`` (checked before it runs)."""
    device_ids(node, count)
    validate_plugin_dir(plugin_dir)
    return [
        python, str(SCRIPT), "--node", node, "--count", str(count),
        "--plugin-dir", str(plugin_dir), "--status-file", str(status_file),
    ]  # fmt: skip


def read_status(path: Path) -> dict[str, Any] | None:
    """What the stand-in wrote to its status file (None before it wrote it)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", required=True, help="node name: the ids derive from it")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help="GPUs to advertise")
    parser.add_argument("--plugin-dir", type=Path, default=PLUGIN_DIR)
    parser.add_argument("--endpoint", default=ENDPOINT, help="socket name in the folder")
    parser.add_argument("--resource", default=RESOURCE)
    parser.add_argument("--status-file", type=Path, help="JSON written on every change")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s deviceplugin %(message)s", stream=sys.stdout
    )
    try:
        plugin = StandIn(
            device_ids(args.node, args.count),
            plugin_dir=args.plugin_dir,
            endpoint=args.endpoint,
            resource=args.resource,
            status_file=args.status_file,
        )
    except DeviceError as err:
        parser.error(str(err))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        plugin.start()
        log.info("serving %d x %s on %s", len(plugin.devices), plugin.resource, plugin.socket)
        plugin.run(stop)
    except DeviceError as err:
        log.error("%s", err)
        return 2
    finally:
        plugin.stop()
        log.info("stopped; %s removed", plugin.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
