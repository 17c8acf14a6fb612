"""The device-plugin stand-in without a kubelet (tests/cluster/deviceplugin.py): its
messages encode as the documented v1beta1 API says, bad input is refused with advice,
and over real gRPC on unix sockets a fake kubelet registers it, allocates through it and
restarts under it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from tests.cluster import deviceplugin as dp
from tests.cluster.deviceplugin import RESOURCE, VISIBLE_DEVICES, DeviceError

IDS = dp.device_ids("real-0", 4)


def varint_field(number: int, value: int) -> bytes:
    assert value < 128
    return bytes([number << 3 | 0, value])


def bytes_field(number: int, data: bytes) -> bytes:
    """A length-delimited field (string, message, map entry) as the wire format has it."""
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


# -- the wire format, field by field from the documented API -------------------------


def test_a_register_request_encodes_with_the_apis_field_numbers() -> None:
    expected = (
        bytes_field(1, b"v1beta1")  # version = 1
        + bytes_field(2, b"torchyard-gpu.sock")  # endpoint = 2
        + bytes_field(3, b"nvidia.com/gpu")  # resource_name = 3
        # options = 4 { get_preferred_allocation_available = 2: true }
        + bytes_field(4, varint_field(2, 1))
    )
    assert dp.register_request().SerializeToString(deterministic=True) == expected


def test_allocate_answers_with_nvidia_visible_devices_in_a_map_entry() -> None:
    # AllocateRequest { container_requests = 1 { devices_ids = 1, ... } } from the kubelet
    wire = bytes_field(1, bytes_field(1, IDS[2].encode()) + bytes_field(1, IDS[0].encode()))
    request = dp.MESSAGES["AllocateRequest"].FromString(wire)
    response = dp.allocate(IDS, request)
    value = f"{IDS[2]},{IDS[0]}".encode()  # in the order the kubelet gave them
    entry = bytes_field(1, VISIBLE_DEVICES.encode()) + bytes_field(2, value)
    # AllocateResponse { container_responses = 1 { envs = 1 { key = 1, value = 2 } } }
    inner = bytes([1 << 3 | 2, len(entry)]) + entry
    expected = bytes([1 << 3 | 2, len(inner)]) + inner
    assert response.SerializeToString(deterministic=True) == expected


def test_list_and_watch_sends_healthy_devices_by_id() -> None:
    response = dp.list_response(IDS[:1])
    device = bytes_field(1, IDS[0].encode()) + bytes_field(2, b"Healthy")  # ID = 1, health = 2
    assert response.SerializeToString() == bytes_field(1, device)  # devices = 1


def test_the_services_have_the_kubelets_method_paths_and_streaming() -> None:
    proto = dp.file_descriptor()
    assert proto.package == "v1beta1" and proto.syntax == "proto3"
    methods = {
        f"/v1beta1.{s.name}/{m.name}": m.server_streaming for s in proto.service for m in s.method
    }
    assert methods == {
        "/v1beta1.Registration/Register": False,
        "/v1beta1.DevicePlugin/GetDevicePluginOptions": False,
        "/v1beta1.DevicePlugin/ListAndWatch": True,
        "/v1beta1.DevicePlugin/GetPreferredAllocation": False,
        "/v1beta1.DevicePlugin/Allocate": False,
        "/v1beta1.DevicePlugin/PreStartContainer": False,
    }


def test_an_unknown_message_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(DeviceError, match=r"no message 'Devices'.*'Device'"):
        dp.new("Devices")


# -- ids and allocations --------------------------------------------------------------


def test_ids_look_like_nvidias_and_are_stable_per_node() -> None:
    assert dp.device_ids("real-0", 4) == IDS  # the same on every start: the checkpoint holds
    assert len(set(IDS)) == 4
    assert all(i.startswith("GPU-") and len(i) == 40 for i in IDS)  # kubelet's limit: 63
    assert not set(dp.device_ids("real-1", 4)) & set(IDS)
    assert dp.device_ids("real-0", 2) == IDS[:2]


@pytest.mark.parametrize("node", ["", "Real-0", "../real-0", "real_0", "a" * 64, "real-0/"])
def test_a_bad_node_name_is_refused(node: str) -> None:
    with pytest.raises(DeviceError, match="DNS-1123"):
        dp.device_ids(node)


@pytest.mark.parametrize("count", [0, -1, dp.MAX_COUNT + 1, True, 2.0, "4"])
def test_a_bad_count_is_refused(count: Any) -> None:
    with pytest.raises(DeviceError, match=f"from 1 to {dp.MAX_COUNT}"):
        dp.validate_count(count)


@pytest.mark.parametrize(
    "devices", [[], [IDS[0], IDS[0]], ["GPU-" + "0" * 60], ["../gpu"], ["GPU 1"], [""]]
)
def test_devices_the_kubelet_could_not_take_are_refused(devices: list[str], folder: Path) -> None:
    with pytest.raises(DeviceError, match="each distinct, at most 63"):
        dp.StandIn(devices, plugin_dir=folder)
    assert os.listdir(folder) == []


def allocate_request(*containers: list[str]) -> Message:
    return dp.new(
        "AllocateRequest",
        container_requests=[dp.new("ContainerAllocateRequest", devices_ids=c) for c in containers],
    )


def test_each_container_sees_only_its_own_devices() -> None:
    response = dp.allocate(IDS, allocate_request(IDS[:2], [IDS[3]]))
    envs = [dict(c.envs) for c in response.container_responses]  # type: ignore[attr-defined]
    assert envs == [{VISIBLE_DEVICES: f"{IDS[0]},{IDS[1]}"}, {VISIBLE_DEVICES: IDS[3]}]


@pytest.mark.parametrize(
    ("ids", "error"),
    [
        (["GPU-00000000-0000-0000-0000-000000000000"], "unknown device ids"),
        ([IDS[0], IDS[0]], "appears twice"),
        ([], "no device ids"),
        ([f"{IDS[0]},{IDS[1]}"], "unknown device ids"),  # one id smuggling two
        ([IDS[0] + "\n"], "unknown device ids"),
    ],
)
def test_an_allocation_of_devices_it_does_not_have_is_refused(ids: list[str], error: str) -> None:
    with pytest.raises(DeviceError, match=error):
        dp.allocate(IDS, allocate_request(IDS[:1], ids))


def preferred_request(available: list[str], must: list[str], size: int) -> Message:
    container = dp.new(
        "ContainerPreferredAllocationRequest",
        available_deviceIDs=available,
        must_include_deviceIDs=must,
        allocation_size=size,
    )
    return dp.new("PreferredAllocationRequest", container_requests=[container])


def test_the_preferred_allocation_keeps_the_must_include_ids_then_the_lowest() -> None:
    response = dp.preferred(IDS, preferred_request([IDS[3], IDS[1], IDS[2]], [IDS[3]], 2))
    (chosen,) = response.container_responses  # type: ignore[attr-defined]
    assert list(chosen.deviceIDs) == [IDS[3], IDS[1]]


@pytest.mark.parametrize(
    ("available", "must", "size", "error"),
    [
        (IDS[:2], [], 3, "allocation_size 3"),
        (IDS[:2], IDS[:2], 1, "allocation_size 1"),
        (IDS[:2], [], -1, "allocation_size -1"),
        (IDS[:2], [IDS[3]], 1, "unknown device ids"),  # must-include not available
        (["GPU-x"], [], 1, "unknown device ids"),
    ],
)
def test_a_bad_preferred_allocation_request_is_refused(
    available: list[str], must: list[str], size: int, error: str
) -> None:
    with pytest.raises(DeviceError, match=error):
        dp.preferred(IDS, preferred_request(available, must, size))


# -- names and paths ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "amd.com/gpu", "example.org/fpga-x1"])
def test_extended_resource_names_are_accepted(name: str) -> None:
    assert dp.validate_resource(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "gpu",
        "nvidia.com/",
        "/gpu",
        "kubernetes.io/gpu",
        "example.kubernetes.io/gpu",
        "nvidia.com/requests.gpu",
        "nvidia.com/../gpu",
        "nvidia.com/gpu/0",
        "NVIDIA.com/gpu",
        "nvidia%2ecom/gpu",
        "localhost/gpu",
    ],
)
def test_a_resource_name_the_kubelet_would_refuse_is_refused_first(name: str) -> None:
    with pytest.raises(DeviceError, match=r"extended resource name.*e\.g\. nvidia\.com/gpu"):
        dp.validate_resource(name)


@pytest.mark.parametrize(
    "endpoint",
    [
        "kubelet.sock",
        "../kubelet.sock",
        "/var/lib/kubelet/device-plugins/x.sock",
        "sub/x.sock",
        "..sock",
        "%2e%2e%2fx.sock",
        "x",
        "x.sock\0",
        "a" * 90 + ".sock",
    ],
)
def test_an_endpoint_outside_the_plain_socket_names_is_refused(endpoint: str) -> None:
    with pytest.raises(DeviceError, match="plain socket file name"):
        dp.validate_endpoint(endpoint)


@pytest.mark.parametrize("folder", ["relative/dir", "/var/lib/kubelet/../../etc"])
def test_a_plugin_folder_must_be_absolute_without_dot_dot(folder: str) -> None:
    with pytest.raises(DeviceError, match=re.escape("absolute path without '..'")):
        dp.validate_plugin_dir(Path(folder))


def test_a_plugin_folder_too_long_for_a_unix_socket_is_refused() -> None:
    with pytest.raises(DeviceError, match="over the 107 a unix socket allows"):
        dp.validate_plugin_dir(Path("/" + "d" * 100))


def test_the_command_is_checked_before_it_runs(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="from 1 to"):
        dp.command(node="real-0", count=0, status_file=tmp_path / "s.json")
    cmd = dp.command(node="real-0", count=2, status_file=tmp_path / "s.json")
    assert cmd[1] == str(dp.SCRIPT) and cmd[cmd.index("--count") + 1] == "2"


# -- over real gRPC, with a fake kubelet ----------------------------------------------


@pytest.fixture
def folder() -> Iterator[Path]:
    """A short folder (unix socket paths): the device-plugin folder of a fake kubelet."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class FakeKubelet:
    """The kubelet's side: serves Registration on kubelet.sock, and on each registration
    dials the plugin back and watches it, as the device manager does. ``refuse`` makes
    the next registrations fail; ``restart()`` empties the folder and serves anew."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.requests: list[Message] = []
        self.refuse = 0
        self.watched: list[list[str]] = []
        self.server: grpc.Server | None = None
        self.done = threading.Event()

    def _register(self, request: Message, context: grpc.ServicerContext) -> Message:
        if self.refuse:
            self.refuse -= 1
            context.abort(grpc.StatusCode.UNKNOWN, "device plugin already connected")
        self.requests.append(request)
        endpoint = self.folder / request.endpoint  # type: ignore[attr-defined]
        threading.Thread(target=self._watch, args=(endpoint,), daemon=True).start()
        return dp.new("Empty")

    def _watch(self, endpoint: Path) -> None:
        # a connection of its own, as the kubelet dials (grpc's shared pool would reuse one
        # to a socket that is gone)
        options = [("grpc.use_local_subchannel_pool", 1)]
        channel = grpc.insecure_channel(f"unix://{endpoint}", options=options)
        with channel, contextlib.suppress(grpc.RpcError):  # ends when the plugin goes away
            for response in call(channel, "ListAndWatch", stream=True)(dp.new("Empty")):
                self.watched.append([d.ID for d in response.devices])  # type: ignore[attr-defined]

    def start(self) -> FakeKubelet:
        request, response = dp._codec("Registration", "Register")
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self._register,
                    request_deserializer=request.FromString,
                    response_serializer=response.SerializeToString,
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
        self.server.add_insecure_port(f"unix://{self.folder / dp.KUBELET_SOCKET}")
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None

    def restart(self) -> None:
        """As the kubelet's device manager starts: every socket in the folder removed."""
        self.stop()
        for path in self.folder.iterdir():
            if path.is_socket():
                path.unlink()
        self.start()


def call(channel: grpc.Channel, method: str, stream: bool = False) -> Callable[..., Any]:
    request, response = dp._codec("DevicePlugin", method)
    make = channel.unary_stream if stream else channel.unary_unary
    return make(
        dp.method_path("DevicePlugin", method),
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )


def wait(what: str, check: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def running(folder: Path) -> Iterator[tuple[FakeKubelet, dp.StandIn]]:
    kubelet = FakeKubelet(folder).start()
    plugin = dp.StandIn(IDS, plugin_dir=folder, status_file=folder / "status.json").start()
    stop = threading.Event()
    thread = threading.Thread(target=plugin.run, args=(stop,), kwargs={"poll": 0.02})
    thread.start()
    try:
        yield kubelet, plugin
    finally:
        stop.set()
        thread.join(timeout=10)
        plugin.stop()
        kubelet.stop()


def test_it_registers_and_serves_what_the_kubelet_asks(
    running: tuple[FakeKubelet, dp.StandIn], folder: Path
) -> None:
    kubelet, plugin = running
    wait("a registration", lambda: kubelet.requests)
    (request,) = kubelet.requests
    assert (request.version, request.endpoint, request.resource_name) == (  # type: ignore[attr-defined]
        "v1beta1",
        dp.ENDPOINT,
        RESOURCE,
    )
    wait("the kubelet's watch", lambda: kubelet.watched)
    assert kubelet.watched[0] == IDS
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        options = call(channel, "GetDevicePluginOptions")(dp.new("Empty"))
        assert options.get_preferred_allocation_available and not options.pre_start_required
        response = call(channel, "Allocate")(allocate_request([IDS[1], IDS[2]]))
        (container,) = response.container_responses
        assert dict(container.envs) == {VISIBLE_DEVICES: f"{IDS[1]},{IDS[2]}"}
        preferred = call(channel, "GetPreferredAllocation")(preferred_request(IDS, [], 2))
        assert list(preferred.container_responses[0].deviceIDs) == IDS[:2]
        assert call(channel, "PreStartContainer")(dp.new("PreStartContainerRequest")) == dp.new(
            "PreStartContainerResponse"
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(channel, "Allocate")(allocate_request(["GPU-../../etc"]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "unknown device ids ['GPU-../../etc']" in refused.value.details()  # type: ignore[attr-defined]
    status = dp.read_status(folder / "status.json")
    assert status is not None
    assert (status["registrations"], status["watches"]) == (1, 1)
    assert status["allocations"] == [[IDS[1], IDS[2]]]  # the refused one is not counted


def test_it_serves_again_and_registers_again_when_the_kubelet_restarts(
    running: tuple[FakeKubelet, dp.StandIn],
) -> None:
    kubelet, plugin = running
    wait("the first watch", lambda: kubelet.watched)
    first = dp.socket_identity(plugin.socket)
    kubelet.refuse = 2  # the restarted kubelet still knows the old connection for a while
    kubelet.restart()
    wait("a second registration", lambda: len(kubelet.requests) == 2)
    wait("a second watch", lambda: len(kubelet.watched) == 2)
    assert dp.socket_identity(plugin.socket) not in (None, first)
    assert kubelet.refuse == 0 and plugin.registrations == 2


def test_stop_removes_the_socket_and_leaves_a_file_it_does_not_own(folder: Path) -> None:
    plugin = dp.StandIn(IDS, plugin_dir=folder).start()
    assert plugin.socket.is_socket()
    plugin.stop()
    plugin.stop()  # twice is fine
    assert not plugin.socket.exists()
    plugin.socket.write_text("not ours")
    with pytest.raises(DeviceError, match="is not a socket: remove it"):
        dp.StandIn(IDS, plugin_dir=folder).start()
    assert plugin.socket.read_text() == "not ours"
    plugin.socket.unlink()
    plugin.socket.symlink_to(folder / "elsewhere.sock")
    with pytest.raises(DeviceError, match="is not a socket"):
        dp.StandIn(IDS, plugin_dir=folder).start()
    assert plugin.socket.is_symlink()
    assert not dp.remove_socket(plugin.socket) and plugin.socket.is_symlink()


def test_as_a_program_it_registers_then_ends_on_sigterm_without_its_socket(
    folder: Path,
) -> None:
    kubelet = FakeKubelet(folder).start()
    status = folder / "status.json"
    cmd = dp.command(node="real-0", count=2, status_file=status, plugin_dir=folder)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait("the program's registration", lambda: kubelet.watched, timeout=20)
        assert kubelet.watched[0] == IDS[:2]
        assert (dp.read_status(status) or {}).get("pid") == proc.pid
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=20)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        kubelet.stop()
    assert proc.returncode == 0, output
    assert not (folder / dp.ENDPOINT).exists()
    assert "registered nvidia.com/gpu (2 devices)" in output


def test_as_a_program_bad_arguments_end_it_with_advice(folder: Path) -> None:
    cmd = dp.command(node="real-0", status_file=folder / "s.json", plugin_dir=folder)
    result = subprocess.run(
        [*cmd, "--resource", "kubernetes.io/gpu"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "e.g. nvidia.com/gpu" in result.stderr
    assert os.listdir(folder) == []  # nothing served, nothing written


def test_a_stand_in_left_by_a_killed_session_is_found_by_its_node_folder(folder: Path) -> None:
    """What RealNode's stop (and the next start's stale clean-up) ends: the stand-in whose
    arguments point into that node's folder, and no other."""
    from tests.cluster.realnode import RealNode

    ours, other = folder / "node", folder / "other"
    ours.mkdir()
    other.mkdir()
    kubelet = FakeKubelet(folder).start()
    cmd = dp.command(node="real-0", status_file=ours / "dp.json", plugin_dir=folder)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait("the stand-in to start", lambda: dp.read_status(ours / "dp.json"), timeout=20)
        node = RealNode(NoCluster(), workdir=ours, log=False)  # type: ignore[arg-type]
        assert node._device_plugin_pids() == [proc.pid]
        elsewhere = RealNode(NoCluster(), workdir=other, log=False)  # type: ignore[arg-type]
        assert elsewhere._device_plugin_pids() == []
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        kubelet.stop()
    assert node._device_plugin_pids() == []  # an ended one is not counted


class NoCluster:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the cluster was used: {name}")
