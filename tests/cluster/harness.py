"""A real Kubernetes control plane on loopback, for integration tests and benchmarks.

``Cluster.start()`` runs etcd, kube-apiserver (RBAC on, service-account signing keys,
client-certificate auth; clients use loopback, while the ``kubernetes`` Service points at
this machine's own address so that Pods of a real node reach it, as
``hack/local-up-cluster.sh`` does), kube-controller-manager (garbage collection,
service-account tokens, ...) and kube-scheduler from the binaries that
``tests/cluster/binaries.py`` builds, waits for ``/readyz`` and the ``default``
namespace, applies ``crds/`` and waits until each is served, not only ``Established``
(a LIST answers 200 and a dry-run create of an invalid object is refused as Invalid by
its schema), before the controller manager starts, so its garbage collector knows them;
then starts KWOK with fake
nodes: a GPU pool (4 nodes x 8 ``nvidia.com/gpu``, ``torchyard.dev/pool=a100``, tainted
``nvidia.com/gpu=present:NoSchedule``) and a CPU pool. ``Cluster.stop()`` ends every
process it started (each in its own process group) and removes the working folder.

Used by ``tests/conftest.py`` (one cluster per pytest session) and ``benchmarks/``;
``python -m tests.cluster.harness`` keeps one up for manual use (``--real-node``: with
the real kubelet node of ``tests/cluster/realnode.py``; ``--peers``: with Kubeflow's
operators of ``tests/cluster/peers.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import binaries

REPO = Path(__file__).resolve().parents[2]
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Pool:
    """A pool of fake nodes KWOK keeps Ready."""

    name: str
    nodes: int
    gpus: int
    cpu: str
    memory: str
    taints: tuple[dict[str, str], ...] = ()


DEFAULT_POOLS = (
    Pool("a100", nodes=4, gpus=8, cpu="96", memory="1Ti", taints=(GPU_TAINT,)),
    Pool("cpu", nodes=2, gpus=0, cpu="32", memory="128Gi"),
)


# The first address of the apiserver's --service-cluster-ip-range: the `kubernetes` Service.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"


def host_address() -> str | None:
    """This machine's own non-loopback IPv4 address (the default route's source), which a
    Pod's network namespace can reach; None on a machine without such a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the source
        except OSError:
            return None
        address: str = s.getsockname()[0]
    return None if address.startswith("127.") else address


# What ends a harness: each unwinds like Ctrl-C (stop() ends what it started).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def dies_with_us() -> list[str]:
    """The command prefix after which a child gets SIGKILL when this process dies, by any
    signal (SIGKILL too: pytest-timeout's last resort, a killed test's ``process.kill()``),
    so that no etcd, apiserver or kubelet outlives a harness that could not stop it:
    util-linux's ``setpriv --pdeathsig``, not a ``preexec_fn``. A ``preexec_fn`` makes
    ``subprocess`` fork() instead of vfork(), and a fork() while gRPC's threads run (the
    GPU device plugin's server, in the test process) runs gRPC's fork handlers in the
    child, which abort it now and then (SIGABRT, "epoll_wait error: Bad file
    descriptor") before it ever execs. Linux only (nothing elsewhere), and only from the
    main thread: the kernel sends the signal when the *thread* that started the child
    ends, and a helper thread ends long before the cluster should."""
    if not sys.platform.startswith("linux"):
        return []
    if threading.current_thread() is not threading.main_thread():
        return []
    return ["setpriv", "--pdeathsig", "KILL", "--"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_manifest(pool: Pool, index: int) -> dict[str, Any]:
    """A fake node of ``pool`` (KWOK keeps the capacity given here)."""
    capacity = {"cpu": pool.cpu, "memory": pool.memory, "pods": "110"}
    labels = {
        "type": "kwok",
        "torchyard.dev/pool": pool.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": f"{pool.name}-{index}",
    }
    if pool.gpus:
        capacity["nvidia.com/gpu"] = str(pool.gpus)
        labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"{pool.name}-{index}",
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [dict(t) for t in pool.taints]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


@dataclass
class Cluster:
    """One control plane; ``kubeconfig`` is an admin (system:masters) kubeconfig."""

    pools: tuple[Pool, ...] = DEFAULT_POOLS
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="torchyard-k8s-")))
    verbose: bool = False
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # What the `kubernetes` Service's endpoint is (set by start()): this machine's address,
    # or None when it has none (then the Service has no endpoint and Pods cannot reach it).
    advertise_address: str | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> Cluster:
        t0 = time.monotonic()
        try:
            for tool in ("etcd", "kwok", "kubernetes"):
                binaries.build(binaries.TOOLS[tool])
            self.timings["binaries"] = time.monotonic() - t0
            t1 = time.monotonic()
            self._pki()
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready()
            self.timings["apiserver"] = time.monotonic() - t1
            # CRDs first: the garbage collector of the controller manager then knows them
            # from its first discovery (it would otherwise notice them up to 30s later).
            self._apply_crds()
            self._start("kube-controller-manager", self._controller_manager_args())
            self._start("kube-scheduler", self._scheduler_args())
            self._start_kwok()
            self._create_nodes()
            self._wait_for_default_serviceaccount("default")
            self.timings["total"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes.clear()
        if not os.environ.get("TORCHYARD_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pieces ------------------------------------------------------------------

    def _bin(self, name: str) -> str:
        tool = {"etcd": "etcd", "kwok": "kwok"}.get(name, "kubernetes")
        return str(binaries.TOOLS[tool].path(name))

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.processes[name] = subprocess.Popen(
            [*dies_with_us(), self._bin(name), *args],  # killed with this process, however it dies
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() ends it and its children
        )

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.workdir, check=True, capture_output=True)

    def _pki(self) -> None:
        """A CA, the apiserver's serving certificate, an admin client certificate, SA keys."""
        w = self.workdir
        # Clients on this machine use 127.0.0.1; Pods reach the `kubernetes` Service (its
        # ClusterIP, DNS names) whose endpoint is this machine's address: all verify.
        self.advertise_address = host_address()
        names = ["IP:127.0.0.1", "DNS:localhost", f"IP:{KUBERNETES_SERVICE_IP}", "DNS:kubernetes"]
        names += [f"DNS:kubernetes.default{d}" for d in ("", ".svc", ".svc.cluster.local")]
        if self.advertise_address:
            names.append(f"IP:{self.advertise_address}")
        (w / "san.cnf").write_text(f"subjectAltName={','.join(names)}\n")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=torchyard-test-ca",
        )
        for name, subj, ext in (
            ("apiserver", "/CN=kube-apiserver", ["-extfile", "san.cnf"]),
            ("admin", "/O=system:masters/CN=torchyard-admin", []),
        ):
            self._openssl(
                "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj
            )
            self._openssl(
                "x509",
                "-req",
                "-in",
                f"{name}.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                f"{name}.crt",
                "-days",
                "2",
                *ext,
            )
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
        self._openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.apiserver_port = free_port()
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "torchyard-test",
                            "cluster": {
                                "server": self.server,
                                "certificate-authority": str(w / "ca.crt"),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "admin",
                            "user": {
                                "client-certificate": str(w / "admin.crt"),
                                "client-key": str(w / "admin.key"),
                            },
                        }
                    ],
                    "contexts": [
                        {
                            "name": "torchyard-test",
                            "context": {"cluster": "torchyard-test", "user": "admin"},
                        }
                    ],
                    "current-context": "torchyard-test",
                }
            )
        )

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        self._start(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        w = self.workdir
        if self.advertise_address:
            # As hack/local-up-cluster.sh: every address (loopback for the clients here,
            # this machine's for Pods), and this machine's as the `kubernetes` Service's
            # endpoint, which kube-proxy on a real node routes 10.96.0.1:443 to.
            address = ["--bind-address=0.0.0.0", f"--advertise-address={self.advertise_address}"]
        else:
            # loopback may not be published as the kubernetes Service endpoint
            address = ["--bind-address=127.0.0.1", "--endpoint-reconciler-type=none"]
        self._start(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                *address,
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={w / 'apiserver.crt'}",
                f"--tls-private-key-file={w / 'apiserver.key'}",
                f"--client-ca-file={w / 'ca.crt'}",
                # logs/exec through a real kubelet (tests/cluster/realnode.py), which
                # listens on its node's InternalIP (the host name resolves to loopback)
                f"--kubelet-client-certificate={w / 'admin.crt'}",
                f"--kubelet-client-key={w / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={w / 'sa.pub'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--max-requests-inflight=800",
                "--max-mutating-requests-inflight=400",
                "--v=1",
            ],
        )

    def _controller_manager_args(self) -> list[str]:
        w = self.workdir
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--service-account-private-key-file={w / 'sa.key'}",
            f"--root-ca-file={w / 'ca.crt'}",
            "--controllers=*",
            "--concurrent-gc-syncs=20",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ]

    def _start_kwok(self) -> None:
        self._start(
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
                "--node-lease-duration-seconds=40",
                "--cidr=10.0.0.1/16",
                "--node-ip=10.0.0.1",
            ],
        )

    # -- talking to it -------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
        ctx.load_cert_chain(str(self.workdir / "admin.crt"), str(self.workdir / "admin.key"))
        return ctx

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A raw admin request (for the harness itself; tests use torchyard.k8s)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw[:1] == b"{" else raw.decode()

    def node_not_ready(self, node: str) -> None:
        """KWOK lets go of ``node``, which then says NotReady, as a kubelet that stopped."""
        self.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}-")
        ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "test"}
        self.kubectl(
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"conditions": [ready]}}),
        )

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [
                self._bin("kubectl"),
                f"--kubeconfig={self.kubeconfig}",
                f"--cache-dir={self.workdir / 'kubectl-cache'}",
                *args,
            ],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout if check else result.stdout + result.stderr

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def wait_for(self, what: str, check: Any, timeout: float = 60.0, interval: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            with contextlib.suppress(OSError, urllib.error.URLError, ssl.SSLError):
                result = check()
                if result:
                    return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def _wait_ready(self) -> None:
        self.wait_for("kube-apiserver /readyz", lambda: self.request("GET", "/readyz")[0] == 200)
        self.wait_for(
            "the default namespace",
            lambda: self.request("GET", "/api/v1/namespaces/default")[0] == 200,
        )

    def _apply_crds(self) -> None:
        self.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=torchyard",
        )

        def published() -> bool:
            # kubectl explain reads the OpenAPI v3 document, published a moment later.
            code, body = self.request("GET", "/openapi/v3/apis/torchyard.dev/v1alpha1")
            schemas = body.get("components", {}).get("schemas", {}) if code == 200 else {}
            return all(
                f"dev.torchyard.v1alpha1.{k}" in schemas
                for k in ("TrainingRun", "Environment", "ModelVersion")
            )

        self.wait_for("the CRDs' OpenAPI schemas", published, timeout=60)
        # Established is not yet serving: the first write may still meet a 404 or a
        # handler without its schema. Hand the cluster out only once every resource lists
        # and validates.
        self.wait_for("the CRDs served and validating", self._crds_served, timeout=60)
        # kubectl caches discovery (fetched above, before the CRDs existed): refresh it.
        self.wait_for(
            "the CRDs in kubectl's discovery",
            lambda: (
                "trainingruns.torchyard.dev"
                in self.kubectl("api-resources", "--api-group=torchyard.dev", "-o", "name")
            ),
            timeout=60,
        )

    def _crds_served(self) -> bool:
        for crd in sorted(REPO.glob("crds/*.yaml")):
            doc = yaml.safe_load(crd.read_text())
            group, plural = doc["spec"]["group"], doc["spec"]["names"]["plural"]
            version = next(v["name"] for v in doc["spec"]["versions"] if v.get("served"))
            path = f"/apis/{group}/{version}/namespaces/default/{plural}"
            if self.request("GET", path)[0] != 200:
                return False
            probe = {
                "apiVersion": f"{group}/{version}",
                "kind": doc["spec"]["names"]["kind"],
                "metadata": {"name": "harness-probe"},
                "spec": {},  # misses required fields: only a validating handler says 422
            }
            code, body = self.request("POST", f"{path}?dryRun=All", probe)
            if code != 422 or not isinstance(body, dict) or body.get("reason") != "Invalid":
                return False
        return True

    def _create_nodes(self) -> None:
        for pool in self.pools:
            for i in range(pool.nodes):
                code, body = self.request("POST", "/api/v1/nodes", node_manifest(pool, i))
                if code not in (201, 409):
                    raise RuntimeError(f"creating node {pool.name}-{i}: {code} {body}")

        def all_ready() -> bool:
            code, body = self.request("GET", "/api/v1/nodes")
            ready = [
                n
                for n in body.get("items", [])
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            ]
            return code == 200 and len(ready) == sum(p.nodes for p in self.pools)

        self.wait_for("KWOK nodes Ready", all_ready, timeout=60)

    def _wait_for_default_serviceaccount(self, namespace: str) -> None:
        self.wait_for(
            f"serviceaccount default in {namespace}",
            lambda: (
                self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0]
                == 200
            ),
            timeout=60,
        )

    def create_namespace(self, name: str, fresh: bool = False) -> str:
        """Namespace ``name``, made (one already there will do, unless ``fresh``: then ''
        when it exists, which may still be being deleted)."""
        code, body = self.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if code == 409 and fresh:
            return ""
        if code not in (201, 409):
            raise RuntimeError(f"creating namespace {name}: {code} {body}")
        self._wait_for_default_serviceaccount(name)
        return name

    def delete_namespace(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{name}")


def _interrupted(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Keep a cluster up until Ctrl-C or SIGTERM, printing how to reach it; either stops
    every process it started. ``--real-node`` adds the real kubelet node
    (``tests/cluster/realnode.py``, root): then stopping also undoes what the node changed
    on the host, and the exit status is 1 if anything was left."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.harness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="also join a real kubelet node (containerd, CNI, CoreDNS, kube-proxy; as root) "
        "labelled torchyard.dev/pool=real",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run Kubeflow Trainer, JobSet and Training Operator (tests/cluster/peers.py)",
    )
    args = parser.parse_args(argv)
    if args.real_node:
        from tests.cluster import realnode  # imports this module: only when asked for

        return realnode.main([])
    # While starting, SIGTERM and SIGHUP unwind like Ctrl-C (Cluster.start stops what it
    # started; a closed terminal's SIGHUP would otherwise end the process alone).
    for sig in STOP_SIGNALS[1:]:
        signal.signal(sig, _interrupted)
    cluster = Cluster()
    try:
        cluster.start()
        if args.peers:
            from tests.cluster.peers import Peers  # builds them from Go modules once

            Peers(cluster).start()  # their processes are the cluster's: stop() ends them
        # Then block both before waiting for them: sigwait takes a blocked signal, while
        # an unblocked SIGTERM would end the process at once, leaking the cluster. (Blocked
        # only now: the processes started above must not inherit the mask.)
        signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
        print(
            textwrap.dedent(
                f"""\
                control plane up in {cluster.timings["total"]:.1f}s
                  export KUBECONFIG={cluster.kubeconfig}
                  kubectl get nodes      # KWOK fake nodes
                logs in {cluster.workdir}; Ctrl-C to stop"""
            ),
            flush=True,
        )
        signal.sigwait(set(STOP_SIGNALS))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
