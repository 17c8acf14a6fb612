"""A REAL kubelet node beside a running test control plane: containers, not KWOK fakes.

``RealNode(cluster).start()`` joins one node to a running ``tests.cluster.harness.Cluster``
(it reads the cluster's CA, apiserver address and admin credentials from
``cluster.workdir``/``cluster.server``) with everything Kubernetes' own
``hack/local-up-cluster.sh`` runs, from this machine only:

- **containerd + runc + CNI plugins** (Debian packages that ``tests/cluster/debian.py``
  installs when missing), containerd in the foreground with a private root, state and
  socket; CRI with the cgroupfs driver, ``restrict_oom_score_adj`` (this VM withholds
  CAP_SYS_RESOURCE), the local pause image as sandbox, a ``bridge`` + ``host-local``
  network on its own bridge (``torchyard0``, ``10.244.0.0/24`` by default);
- **kubelet** and **kube-proxy** (iptables mode) built from the control plane's pinned
  Kubernetes module, **CoreDNS** from its own Go module (``tests/cluster/binaries.py``
  ``NODE_TOOLS``); CoreDNS runs as a host process on the bridge's gateway address and
  serves ``cluster.local`` from the apiserver; the kubelet registers the node labelled
  ``torchyard.dev/pool=real`` with cgroup v1 allowed (``failCgroupV1: false``);
- the **pause**, **Python** and CPU **PyTorch** images made locally
  (``tests/cluster/images.py``) and the project's own **torchyard** image built from
  ``images/operator/Dockerfile`` with buildah (``tests/cluster/buildah.py``), imported into
  containerd; Pods use ``RealNode.images["python" | "pytorch" | "torchyard"].ref`` with
  ``imagePullPolicy: Never``; containerd pulls from a plain-HTTP test registry once
  ``RealNode.pull_over_http(host)`` wrote its ``certs.d/<host>/hosts.toml``;
- a **device-plugin stand-in** (``tests/cluster/deviceplugin.py``, its own process,
  started once the kubelet is Ready) that registers ``gpus`` x ``nvidia.com/gpu`` through
  the kubelet's device-plugin API, so GPU requests go through the kubelet's device manager
  and containers get ``NVIDIA_VISIBLE_DEVICES``; ``RealNode.gpus`` are the advertised ids.

``RealNode.stop()`` undoes it: the Node object, every Pod sandbox (``crictl rmp``), the
processes (and the shims containerd leaves running), the iptables chains of kube-proxy,
the kubelet and the bridge plugin, the kubelet's mounts and cgroups, the Pod network
namespaces, the bridge, the sysctls they change, the host folders they hard-code, and the
working folder; ``leftovers()`` lists whatever is still there. One real node per machine
(a lock file says whose); a node left by a killed session is cleaned up by the next start.

Needs root, cgroups and Debian/Ubuntu's apt. Used by ``tests/node/conftest.py``;
``python -m tests.cluster.realnode`` (or ``python -m tests.cluster.harness --real-node``)
keeps a cluster with the real node up by hand. The
configuration files come from ``tests/cluster/nodeconfig.py`` (pure); the bookkeeping here
is tested in ``tests/unit/cluster/test_realnode.py``, the node itself by ``tests/node/``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from tests.cluster import binaries, buildah, debian, deviceplugin, nodeconfig
from tests.cluster import images as local_images
from tests.cluster.harness import STOP_SIGNALS, Cluster, dies_with_us, free_port
from tests.cluster.nodeconfig import POOL_LABEL, NodeNetwork

# A node's folder: short (unix socket paths) and recognisable (stale clean-up).
WORKDIR_PARENT = Path("/tmp")
WORKDIR_PREFIX = "torchyard-node-"
NETNS_DIR = Path("/var/run/netns")
CONTAINER_LOGS_DIR = Path("/var/log/containers")  # hard-coded in the kubelet
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Folders that the kubelet, containerd 1.6 and libcni hard-code whatever their settings
# (device-plugin socket, shim sockets and runc state, CNI result cache, log links):
# stop() removes those that did not exist before start().
HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
    Path("/var/log/containers"),
)
# iptables chains of the kubelet (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...), kube-proxy
# and the CNI bridge plugin (CNI-...): stop() removes those that did not exist before.
IPTABLES = ("iptables", "ip6tables")
OUR_CHAINS = re.compile(r"^(KUBE|CNI|TORCHYARD)-")
# Test traffic stays on this machine: after DNAT (mangle POSTROUTING sees the final
# destination), a packet from the Pod subnet to anything outside it, or one still addressed
# to the Service range (no kube-proxy rule yet), is dropped instead of leaving through the
# default route. Pods reach the host (apiserver, CoreDNS, registry) through INPUT: untouched.
EGRESS_CHAIN = "TORCHYARD-EGRESS"
NODE_CGROUP = "kubepods"
# What the kubelet (protectKernelDefaults: false), the bridge plugin and kube-proxy
# may change on the host; stop() puts back every value that differs.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
)


class NodeError(debian.SetupError):
    """The real node cannot start or stop cleanly; the message says what to do."""


def lock_path() -> Path:
    return binaries.cache_root() / "realnode.lock"


# -- set-up that is cached outside the clone -----------------------------------------


@dataclass(frozen=True)
class Prepared:
    """What a node needs on this machine, ready: binaries and images, with timings."""

    images: dict[str, local_images.Image]
    timings: dict[str, float]


def binary(name: str) -> str:
    """Where the cached node binary ``name`` (kubelet, kube-proxy, coredns, crictl) is."""
    tool = {"kubelet": "kubernetes-node", "kube-proxy": "kubernetes-node", "crictl": "cri-tools"}
    return str(binaries.TOOLS[tool.get(name, name)].path(name))


def _builder(tool: binaries.Tool) -> Callable[[], object]:
    return lambda: binaries.build(tool)


def prepare(*, log: bool = True) -> Prepared:
    """Install, build and make (once, cached) everything the real node runs."""
    timings: dict[str, float] = {}

    def step(name: str, action: Callable[[], object]) -> None:
        started = time.monotonic()
        action()
        timings[name] = time.monotonic() - started
        if log:
            print(f"[node] step {name}: {timings[name]:.1f}s", flush=True)

    step("packages", debian.ensure_packages)
    for tool in binaries.NODE_TOOLS:
        step(f"build {tool}", _builder(binaries.TOOLS[tool]))
    made: dict[str, local_images.Image] = {}
    step("image pause", lambda: made.setdefault("pause", local_images.ensure_pause_image()))
    step("image python", lambda: made.setdefault("python", local_images.ensure_python_image()))
    step("image pytorch", lambda: made.setdefault("pytorch", local_images.ensure_pytorch_image()))
    # the project's own image, built from images/operator/Dockerfile over the python image
    step(
        "image torchyard",
        lambda: made.setdefault(
            "torchyard", buildah.ensure_project_image("torchyard", base=made["python"])
        ),
    )
    return Prepared(images=made, timings=timings)


# -- the node -------------------------------------------------------------------------


@dataclass
class RealNode:
    """One real kubelet node joined to ``cluster``; ``start()``/``stop()`` or ``with``."""

    cluster: Cluster
    name: str = "real-0"
    pool: str = "real"
    network: NodeNetwork = field(default_factory=NodeNetwork)
    workdir: Path | None = None  # default: a new folder under /tmp
    log: bool = True
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    images: dict[str, local_images.Image] = field(default_factory=dict)
    gpu_count: int = deviceplugin.DEFAULT_COUNT  # nvidia.com/gpu the stand-in advertises
    gpus: list[str] = field(default_factory=list)  # their ids, once started
    _lock: IO[str] | None = None
    _sysctls: dict[str, str] = field(default_factory=dict)
    _netns_before: set[str] = field(default_factory=set)
    _cgroups_before: set[Path] = field(default_factory=set)
    # None: unknown (a killed session's node): its host folders are left alone
    _paths_before: set[Path] | None = None
    _chains_before: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        nodeconfig.validate_node_name(self.name)
        if not nodeconfig.DNS_LABEL.fullmatch(self.pool):
            raise ValueError(f"pool {self.pool!r}: use a DNS-1123 label such as 'real'")
        deviceplugin.validate_count(self.gpu_count)  # a DeviceError (ValueError) says the range
        if self.workdir is None:  # only once the arguments are known to be good
            self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=WORKDIR_PARENT))

    @property
    def root(self) -> Path:
        """The node's working folder: configs, logs, containerd's and the kubelet's state."""
        assert self.workdir is not None  # set by __post_init__
        return self.workdir

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> RealNode:
        t0 = time.monotonic()
        self._acquire_lock()  # before anything that touches the host
        try:
            self._preflight()
            prepared = prepare(log=self.log)
            self.images = dict(prepared.images)
            self.timings.update({f"prepare {k}": v for k, v in prepared.timings.items()})
            self.timings["prepare"] = time.monotonic() - t0
            t1 = time.monotonic()
            self._save_host_state()
            self._pki()
            self._apply_rbac()
            self._bridge_up()
            self._guard_egress()
            self._timed("containerd", self._start_containerd)
            self._timed("import images", self._import_images)
            self._timed("coredns", self._start_coredns)
            self._timed("kubelet", self._start_kubelet)
            self._timed("device plugin", self._start_device_plugin)
            self._timed("kube-proxy", self._start_kube_proxy)
            self._timed("gpus allocatable", self._wait_for_gpus)  # meanwhile reported
            self.timings["start"] = time.monotonic() - t1
            self.timings["total"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        if self.log:
            print(
                f"[node] {self.name} Ready in {self.timings['start']:.1f}s "
                f"(set-up {self.timings['prepare']:.1f}s; {self.root})",
                flush=True,
            )
        return self

    def stop(self) -> None:
        """Undo everything ``start()`` did; safe to call twice or after a failed start."""
        if self._lock is None:
            return  # never started (or another node holds the machine): touch nothing
        started = time.monotonic()
        try:
            self._teardown()
        finally:
            self._release_lock()
        self.timings["stop"] = time.monotonic() - started
        if self.log:
            print(f"[node] {self.name} stopped in {self.timings['stop']:.1f}s", flush=True)

    def _teardown(self) -> None:
        problems: list[str] = []
        self._end("kubelet")  # first: it would restart the sandboxes removed next
        self._stop_device_plugin()
        with contextlib.suppress(Exception):
            self.cluster.request("DELETE", f"/api/v1/nodes/{self.name}")
        self._remove_sandboxes(problems)
        self._end("kube-proxy")
        if Path(binary("kube-proxy")).is_file():
            # iptables-mode rules (its nftables/ipvs clean-up may complain: not used here)
            subprocess.run(
                [binary("kube-proxy"), "--cleanup", "--v=0"],
                capture_output=True,
                check=False,
                timeout=60,
            )
        self._end("coredns")
        self._end("containerd")
        for name in list(self.processes):
            self._end(name)
        self._kill_shims()
        self._unmount_all(problems)
        self._remove_netns()
        self._remove_cgroups()
        self._bridge_down()
        self._restore_sysctls()
        self._remove_log_links()
        self._remove_chains()
        self._remove_host_paths()
        if problems and self.log:
            print("[node] clean-up problems:\n  " + "\n  ".join(problems), flush=True)
        if not os.environ.get("TORCHYARD_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def leftovers(self) -> list[str]:
        """What a stopped node left on the host (empty when ``stop()`` undid everything)."""
        found = []
        if _link_exists(self.network.bridge):
            found.append(f"bridge {self.network.bridge}")
        found += [f"mount {m}" for m in local_images.mounts_below(self.root)]
        found += [f"process {n} ({p.pid})" for n, p in self.processes.items() if p.poll() is None]
        found += [f"shim {pid}" for pid in self._shim_pids()]
        found += [f"device plugin {pid}" for pid in self._device_plugin_pids()]
        if deviceplugin.PLUGIN_DIR.joinpath(deviceplugin.ENDPOINT).is_socket():
            found.append(f"socket {deviceplugin.PLUGIN_DIR / deviceplugin.ENDPOINT}")
        for key, value in self._sysctls.items():
            now = _read_sysctl(key)
            if now is not None and now != value:
                found.append(f"sysctl {key}={now} (was {value})")
        found += [f"netns {n}" for n in sorted(_netns() - self._netns_before)]
        found += [f"cgroup {p}" for p in sorted(_node_cgroups() - self._cgroups_before)]
        for (cmd, table), chains in iptables_chains().items():
            new = chains - self._chains_before.get((cmd, table), set())
            found += [f"{cmd} -t {table} chain {c}" for c in sorted(new) if OUR_CHAINS.match(c)]
        if self._paths_before is not None:
            found += [
                f"folder {p}" for p in HOST_PATHS if p.exists() and p not in self._paths_before
            ]
        return found

    # -- pieces ------------------------------------------------------------------

    def _timed(self, name: str, action: Callable[[], None]) -> None:
        started = time.monotonic()
        action()
        self.timings[name] = time.monotonic() - started
        if self.log:
            print(f"[node] {name}: {self.timings[name]:.1f}s", flush=True)

    def _acquire_lock(self) -> None:
        path = lock_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise NodeError(
                f"another real node runs on this machine ({holder}); one per machine: stop "
                f"it (Ctrl-C its session) or wait, then try again (lock: {path})"
            ) from None
        lock.seek(0)
        previous = lock.read().strip()
        self._lock = lock
        if previous:
            self._clean_stale(previous)
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps({"pid": os.getpid(), "workdir": str(self.root)}))
        lock.flush()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.seek(0)
            self._lock.truncate()
            self._lock.close()
            self._lock = None

    def _clean_stale(self, previous: str) -> None:
        """A session killed without stop() left its node (its processes may still run,
        each in a session of its own): undo what can be found of it."""
        try:
            workdir = Path(json.loads(previous)["workdir"])
        except (ValueError, KeyError, TypeError):
            return
        if workdir.parent != WORKDIR_PARENT or not workdir.name.startswith(WORKDIR_PREFIX):
            # the lock file is only a hint: never remove a folder that is not a node's
            if self.log:
                print(f"[node] not cleaning up {str(workdir)!r}: not a node folder", flush=True)
            return
        if self.log:
            print(f"[node] cleaning up after an earlier node in {workdir}", flush=True)
        stale = RealNode(self.cluster, self.name, self.pool, self.network, workdir, log=False)
        stale._teardown()  # sysctls unknown: left as they are; the rest is ours to remove

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise NodeError(
                "the real node needs root (containerd, mounts, a bridge, cgroups): run the "
                "node tests as root, or use the KWOK pools (tests/integration) instead"
            )
        if (
            not (CGROUP_ROOT / "memory").is_dir()
            and not (CGROUP_ROOT / "cgroup.controllers").exists()
        ):
            raise NodeError(f"no cgroups under {CGROUP_ROOT}: mount them (cgroup v1 or v2)")
        routes = subprocess.run(
            ["ip", "-j", "route", "show"], capture_output=True, text=True, check=False
        ).stdout
        for route in json.loads(routes or "[]"):
            dst, dev = route.get("dst", ""), route.get("dev", "")
            if dst in ("", "default") or dev == self.network.bridge:
                continue
            with contextlib.suppress(ValueError):
                if ipaddress.ip_network(dst, strict=False).overlaps(self.network.network):
                    raise NodeError(
                        f"the Pod subnet {self.network.subnet} overlaps the route {dst} on "
                        f"{dev}: pass another subnet (RealNode(network=NodeNetwork(...)))"
                    )

    def _save_host_state(self) -> None:
        self._sysctls = {k: v for k in SYSCTLS if (v := _read_sysctl(k)) is not None}
        self._netns_before = _netns()
        self._cgroups_before = _node_cgroups()
        self._paths_before = {p for p in HOST_PATHS if p.exists()}
        self._chains_before = iptables_chains()
        _write_sysctl("net/bridge/bridge-nf-call-iptables", "1")  # Service replies on the bridge

    def _guard_egress(self) -> None:
        """Drop what would leave the machine (see EGRESS_CHAIN); stop() removes the chain
        and its jump like the other chains the node added."""
        subnet = str(self.network.network)
        for rule in (
            ["-N", EGRESS_CHAIN],
            ["-A", EGRESS_CHAIN, "-d", str(nodeconfig.SERVICE_CIDR), "-j", "DROP"],
            ["-A", EGRESS_CHAIN, "-s", subnet, "!", "-d", subnet, "-j", "DROP"],
            ["-I", "POSTROUTING", "1", "-j", EGRESS_CHAIN],
        ):
            subprocess.run(["iptables", "-t", "mangle", *rule], check=True, capture_output=True)

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.root, check=True, capture_output=True)

    def _pki(self) -> None:
        """Client certificates signed by the cluster's CA for the node's components."""
        ca = self.cluster.workdir
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for file, subject in (
            ("kubelet", f"/O=system:nodes/CN=system:node:{self.name}"),
            ("kube-proxy", "/CN=system:kube-proxy"),
            ("coredns", "/CN=torchyard-test:coredns"),
        ):
            self._openssl(
                "req", *ec, "-keyout", f"{file}.key", "-out", f"{file}.csr", "-subj", subject
            )
            self._openssl(
                "x509", "-req", "-in", f"{file}.csr", "-CA", str(ca / "ca.crt"),
                "-CAkey", str(ca / "ca.key"), "-set_serial", str(_serial()),
                "-out", f"{file}.crt", "-days", "2",
            )  # fmt: skip
            config = nodeconfig.kubeconfig(
                self.cluster.server,
                ca / "ca.crt",
                self.root / f"{file}.crt",
                self.root / f"{file}.key",
                subject.rsplit("CN=", 1)[1],
            )
            (self.root / f"{file}.kubeconfig").write_text(yaml.safe_dump(config))

    def _apply_rbac(self) -> None:
        docs = "\n---\n".join(yaml.safe_dump(m) for m in nodeconfig.rbac_manifests(self.name))
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=docs)

    def _bridge_up(self) -> None:
        """The bridge exists before containerd's first sandbox: CoreDNS and the kubelet
        listen on its gateway address (the bridge plugin adopts it as it is)."""
        br, gw = self.network.bridge, self.network.gateway
        if _link_exists(br):
            _ip("link", "delete", br)  # left by a killed session
        _ip("link", "add", br, "type", "bridge")
        _ip("addr", "add", f"{gw}/{self.network.network.prefixlen}", "dev", br)
        _ip("link", "set", br, "up")

    def _bridge_down(self) -> None:
        if _link_exists(self.network.bridge):
            _ip("link", "delete", self.network.bridge)

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.processes[name] = subprocess.Popen(
            # killed with this process however it dies; what they leave (containerd's
            # shims, mounts, the bridge) is undone by the next node (_clean_stale)
            [*dies_with_us(), *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def _end(self, name: str, timeout: float = 15) -> None:
        """Stop the process ``name``: ours, or one a killed session left in this workdir."""
        proc = self.processes.pop(name, None)
        if proc is None:
            for pid in _pids_mentioning(self.root, name):
                _terminate(pid, timeout)
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def check_alive(self) -> None:
        for name, proc in [*self.processes.items(), *self.cluster.processes.items()]:
            if proc.poll() is not None:
                folder = self.root if name in self.processes else self.cluster.workdir
                tail = (folder / f"{name}.log").read_text(errors="replace")[-3000:]
                raise NodeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            with contextlib.suppress(OSError, urllib.error.URLError, subprocess.SubprocessError):
                result = check()
                if result:
                    return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    def _start_containerd(self) -> None:
        work = self.root / "containerd"
        (work / "net.d").mkdir(parents=True)
        conflist = nodeconfig.cni_conflist(self.network, self.root / "cni-ipam")
        (work / "net.d" / "10-torchyard.conflist").write_text(json.dumps(conflist, indent=1))
        runc = shutil.which("runc") or "/usr/sbin/runc"
        config = nodeconfig.containerd_config(work, self.images["pause"].ref, runc)
        (work / "config.toml").write_text(config)
        self._start("containerd", ["containerd", "--config", str(work / "config.toml")])
        self.wait_for(
            "containerd's socket",
            lambda: (
                self.containerd_socket.exists()
                and self._ctr("version", check=False).returncode == 0
            ),
            timeout=30,
        )

    def pull_over_http(self, host: str) -> None:
        """Let containerd pull from the plain-HTTP registry ``host:port`` (a test registry,
        e.g. where Environment builds push): its ``certs.d/<host>/hosts.toml``, read at the
        next pull, no restart."""
        folder = self.root / "containerd" / "certs.d" / host
        text = nodeconfig.registry_hosts_toml(host)  # checks host before making folders
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts.toml").write_text(text)

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)

    def _import_images(self) -> None:
        for image in self.images.values():
            local_images.import_image(self.containerd_socket, image, log=self.log)

    def _start_coredns(self) -> None:
        ready = free_port()
        path = self.root / "Corefile"
        path.write_text(nodeconfig.corefile(self.network, self.root / "coredns.kubeconfig", ready))
        self._start("coredns", [binary("coredns"), "-conf", str(path)])
        self.wait_for(
            "CoreDNS ready (synced with the apiserver)",
            lambda: _http_ok(f"http://127.0.0.1:{ready}/ready"),
            timeout=60,
        )

    def _start_kubelet(self) -> None:
        w = self.root
        for sub in ("kubelet", "kubelet-pki", "pod-logs", "volume-plugins"):
            (w / sub).mkdir()
        (w / "resolv.conf").write_text(f"nameserver {self.network.gateway}\n")
        config = nodeconfig.kubelet_config(
            network=self.network,
            port=free_port(),
            healthz_port=free_port(),
            ca_file=self.cluster.workdir / "ca.crt",
            runtime_socket=self.containerd_socket,
            work=w,
        )
        (w / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self._start(
            "kubelet",
            [
                binary("kubelet"),
                f"--config={w / 'kubelet.yaml'}",
                f"--kubeconfig={w / 'kubelet.kubeconfig'}",
                f"--root-dir={w / 'kubelet'}",
                f"--cert-dir={w / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.network.gateway}",
                f"--node-labels={POOL_LABEL}={self.pool}",
                "--v=1",
            ],
        )
        self.wait_for(f"node {self.name} Ready", self.is_ready, timeout=120)

    @property
    def device_plugin_status(self) -> Path:
        return self.root / "device-plugin.json"

    def _start_device_plugin(self) -> None:
        """The GPU stand-in, once the kubelet serves its device-plugin socket."""
        self._start(
            "device-plugin",
            deviceplugin.command(
                node=self.name, count=self.gpu_count, status_file=self.device_plugin_status
            ),
        )

        def watched() -> dict[str, Any] | None:
            status = deviceplugin.read_status(self.device_plugin_status)
            return status if status and status["registrations"] and status["watches"] else None

        status = self.wait_for(
            "the device-plugin stand-in to register and be watched by the kubelet",
            watched,
            timeout=30,
        )
        self.gpus = list(status["devices"])

    def allocatable(self, resource: str = deviceplugin.RESOURCE) -> str | None:
        """The node's ``status.allocatable[resource]`` as the apiserver has it."""
        value = self.node().get("status", {}).get("allocatable", {}).get(resource)
        return str(value) if value is not None else None

    def _wait_for_gpus(self) -> None:
        # the kubelet reports device-plugin capacity with its next status update (2 s)
        want = str(len(self.gpus))
        self.wait_for(
            f"{want} {deviceplugin.RESOURCE} allocatable on {self.name}",
            lambda: self.allocatable() == want,
            timeout=30,
        )

    def _device_plugin_pids(self) -> list[int]:
        """Stand-ins serving this node (by their script and a path in this workdir)."""
        script = deviceplugin.SCRIPT.name.encode()
        marker = str(self.root).encode() + b"/"
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if (
                    len(argv) > 2
                    and argv[1].rsplit(b"/", 1)[-1] == script
                    and any(marker in arg for arg in argv[2:])
                    and _running(int(proc.name))
                ):
                    pids.append(int(proc.name))
        return pids

    def _stop_device_plugin(self) -> None:
        """SIGTERM: the stand-in removes its socket; one a killed session left is found
        by its arguments; a socket left by a SIGKILL is removed here."""
        self._end("device-plugin")
        for pid in self._device_plugin_pids():
            _terminate(pid, timeout=5)
        deviceplugin.remove_socket(deviceplugin.PLUGIN_DIR / deviceplugin.ENDPOINT)

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again with the same arguments, as an upgrade or
        a crash would (containers keep running; the old log is kept as kubelet.log.1)."""
        args = [str(a) for a in self.processes["kubelet"].args]
        self._end("kubelet")
        (self.root / "kubelet.log").replace(self.root / "kubelet.log.1")
        self._start("kubelet", args)
        self.wait_for(f"node {self.name} Ready", self.is_ready, timeout=120)

    def node(self) -> dict[str, Any]:
        code, body = self.cluster.request("GET", f"/api/v1/nodes/{self.name}")
        return body if code == 200 and isinstance(body, dict) else {}

    def is_ready(self) -> bool:
        node = self.node()
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )

    def _start_kube_proxy(self) -> None:
        healthz = free_port()
        config = nodeconfig.kube_proxy_config(
            network=self.network,
            node=self.name,
            kubeconfig=self.root / "kube-proxy.kubeconfig",
            healthz_port=healthz,
            metrics_port=free_port(),
        )
        (self.root / "kube-proxy.yaml").write_text(yaml.safe_dump(config))
        self._start(
            "kube-proxy",
            [binary("kube-proxy"), f"--config={self.root / 'kube-proxy.yaml'}", "--v=1"],
        )
        # /healthz answers 200 once the first iptables sync has been written
        self.wait_for(
            "kube-proxy's first iptables sync",
            lambda: _http_ok(f"http://127.0.0.1:{healthz}/healthz"),
            timeout=60,
        )

    # -- tear-down pieces ----------------------------------------------------------

    def _remove_sandboxes(self, problems: list[str]) -> None:
        if not self.containerd_socket.exists() or self._ctr("version", check=False).returncode:
            return
        crictl = binary("crictl")
        endpoint = f"unix://{self.containerd_socket}"
        result = subprocess.run(
            [crictl, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
             "--timeout", "30s", "rmp", "--all", "--force"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            problems.append(f"crictl rmp: {result.stderr.strip()[-500:]}")
            # at least end the containers' processes
            tasks = self._ctr("tasks", "ls", "-q", check=False).stdout.split()
            for task in tasks:
                self._ctr("tasks", "kill", "-a", "-s", "SIGKILL", task, check=False)

    def _shim_pids(self) -> list[int]:
        """containerd shims serving this node's containerd (they outlive it otherwise)."""
        return _pids_mentioning(self.root, "containerd-shim-runc-v2")

    def _kill_shims(self) -> None:
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _unmount_all(self, problems: list[str]) -> None:
        """The kubelet bind-mounts its root onto itself and mounts Pod volumes below it."""
        for mount in reversed(local_images.mounts_below(self.root)):
            if subprocess.run(["umount", mount], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        left = local_images.mounts_below(self.root)
        if left:
            problems.append(f"still mounted: {left}")

    def _remove_netns(self) -> None:
        for name in sorted(_netns() - self._netns_before):
            path = NETNS_DIR / name
            subprocess.run(["umount", str(path)], capture_output=True, check=False)
            with contextlib.suppress(OSError):
                path.unlink()

    def _remove_cgroups(self) -> None:
        for path in sorted(_node_cgroups() - self._cgroups_before, key=lambda p: -len(p.parts)):
            for sub in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
                if sub.is_dir():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
            with contextlib.suppress(OSError):
                path.rmdir()

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            if _read_sysctl(key) != value:
                _write_sysctl(key, value)

    def _remove_chains(self) -> None:
        for cmd in IPTABLES:
            if shutil.which(f"{cmd}-save") is None:
                continue
            saved = subprocess.run(
                [f"{cmd}-save"], capture_output=True, text=True, check=False
            ).stdout
            for args in chain_removals(saved, self._chains_before, cmd):
                subprocess.run([cmd, "-w", *args], capture_output=True, check=False)

    def _remove_host_paths(self) -> None:
        if self._paths_before is None:
            return
        for path in HOST_PATHS:
            if path.exists() and path not in self._paths_before:
                shutil.rmtree(path, ignore_errors=True)

    def _remove_log_links(self) -> None:
        if not CONTAINER_LOGS_DIR.is_dir():
            return
        for link in CONTAINER_LOGS_DIR.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.root)):
                    link.unlink()


# -- host helpers ---------------------------------------------------------------------


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NodeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _read_sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", key).write_text(value + "\n")


def _netns() -> set[str]:
    """containerd's Pod network namespaces (``cni-<uuid>``) pinned under /var/run/netns."""
    if not NETNS_DIR.is_dir():
        return set()
    return {p.name for p in NETNS_DIR.iterdir() if p.name.startswith("cni-")}


def _node_cgroups() -> set[Path]:
    """The kubelet's cgroup (``kubepods``) in every hierarchy where it exists."""
    if not CGROUP_ROOT.is_dir():
        return set()
    found = {CGROUP_ROOT / NODE_CGROUP} if (CGROUP_ROOT / NODE_CGROUP).is_dir() else set()
    for hierarchy in CGROUP_ROOT.iterdir():
        with contextlib.suppress(OSError):
            if (hierarchy / NODE_CGROUP).is_dir() and not hierarchy.is_symlink():
                found.add(hierarchy / NODE_CGROUP)
    return found


def parse_iptables_save(text: str) -> dict[str, tuple[set[str], list[list[str]]]]:
    """table -> (chains, rules as argument lists) from ``iptables-save`` output."""
    tables: dict[str, tuple[set[str], list[list[str]]]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
            tables[table] = (set(), [])
        elif line.startswith(":") and table:
            tables[table][0].add(line[1:].split()[0])
        elif line.startswith("-A ") and table:
            tables[table][1].append(shlex.split(line))
    return tables


def chain_removals(
    saved: str, before: dict[tuple[str, str], set[str]], cmd: str
) -> list[list[str]]:
    """``iptables`` arguments that remove the KUBE-/CNI- chains which were not there
    ``before``: the rules that jump to them from other chains, then the chains."""
    commands: list[list[str]] = []
    for table, (chains, rules) in parse_iptables_save(saved).items():
        new = {c for c in chains - before.get((cmd, table), set()) if OUR_CHAINS.match(c)}
        if not new:
            continue
        for rule in rules:
            chain, target = rule[1], _target(rule)
            if chain not in new and target in new:
                commands.append(["-t", table, "-D", *rule[1:]])
        commands += [["-t", table, "-F", c] for c in sorted(new)]
        commands += [["-t", table, "-X", c] for c in sorted(new)]
    return commands


def _target(rule: list[str]) -> str:
    for flag in ("-j", "--jump", "-g", "--goto"):
        if flag in rule[:-1]:
            return rule[rule.index(flag) + 1]
    return ""


def iptables_chains() -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for cmd in IPTABLES:
        if shutil.which(f"{cmd}-save") is None:
            continue
        saved = subprocess.run([f"{cmd}-save"], capture_output=True, text=True, check=False)
        for table, (chains, _) in parse_iptables_save(saved.stdout).items():
            found[(cmd, table)] = chains
    return found


def _serial() -> int:
    # a random serial: no serial file beside the cluster's CA to share
    return int.from_bytes(os.urandom(8), "big") >> 1


def _pids_mentioning(workdir: Path, program: str) -> list[int]:
    """Processes running ``program`` with an argument inside ``workdir`` (ours by path)."""
    marker = str(workdir).encode() + b"/"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if Path(argv[0].decode(errors="replace")).name == program and any(
                marker in arg for arg in argv[1:]
            ):
                pids.append(int(proc.name))
    return pids


def _terminate(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:  # the state follows the command's parenthesised name; "Z" has exited
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return int(resp.status) == 200


def _interrupted(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Keep a cluster with the real node up until Ctrl-C or SIGTERM (both clean up)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="install, build and make the node's packages, binaries and images, then exit",
    )
    args = parser.parse_args(argv)
    if args.prepare_only:
        t0 = time.monotonic()
        prepare()
        print(f"[node] prepared in {time.monotonic() - t0:.1f}s", flush=True)
        return 0
    for sig in STOP_SIGNALS[1:]:  # while starting, SIGTERM and SIGHUP unwind like Ctrl-C
        signal.signal(sig, _interrupted)
    cluster = Cluster()
    node: RealNode | None = None
    try:
        cluster.start()
        node = RealNode(cluster).start()
        # sigwait needs the signals blocked (an unblocked SIGTERM would end us at once);
        # blocked only now so that the processes started above do not inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
        python = node.images["python"].ref
        print(
            f"control plane up in {cluster.timings['total']:.1f}s, real node {node.name} "
            f"Ready in {node.timings['start']:.1f}s\n"
            f"  export KUBECONFIG={cluster.kubeconfig}\n"
            f"  kubectl get nodes -L {POOL_LABEL}   # KWOK pools and the real node\n"
            f"  Pods: image {python}, imagePullPolicy: Never, nodeSelector "
            f"{POOL_LABEL}: {node.pool}\n"
            f"  images: {' '.join(f'{k}={v.ref}' for k, v in sorted(node.images.items()))}\n"
            f"  GPUs: {len(node.gpus)} x {deviceplugin.RESOURCE} (the device-plugin stand-in)\n"
            f"logs in {cluster.workdir} and {node.root}; Ctrl-C to stop",
            flush=True,
        )
        signal.sigwait(set(STOP_SIGNALS))
    finally:
        if node is not None:
            node.stop()
        cluster.stop()
    left = node.leftovers() if node is not None else []
    if left:
        print("[node] left on the host:\n  " + "\n  ".join(left), flush=True)
        return 1
    print("[node] stopped; nothing left on the host", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
