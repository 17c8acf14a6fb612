"""Kubeflow's operators beside torchyard on the test control plane, built from their Go modules.

The peers a user compares torchyard with, each a pinned release built once from its Go
module (fetched through the Go module proxy: ``go mod download`` gives the release's whole
folder, its CRD manifests included) into the same cache as ``tests/cluster/binaries.py``:

    ${TORCHYARD_CACHE:-~/.cache/torchyard}/<peer>-<version>/<binary>

- JobSet's controller (``sigs.k8s.io/jobset``, the release Kubeflow Trainer's go.mod pins);
- Kubeflow Trainer v2's controller manager (TrainJob over JobSet, ``torch-distributed``);
- Training Operator v1 (PyTorchJob only: ``--enable-scheme=pytorchjob``).

``Peers(cluster).start()`` applies their CRDs (and Trainer's ClusterTrainingRuntime
``torch-distributed``), starts each controller as a process of the cluster (its log beside
the control plane's; ``Cluster.stop()`` ends it) with the admin kubeconfig, and serves their
admission webhooks to the local apiserver: every webhook configuration points at
``https://127.0.0.1:<port>/<path>``, signed by one CA made here. JobSet takes the
certificate from its configuration file (its internal cert management off, as its flags
allow); Trainer and Training Operator always run their certificate rotator, which keeps the
certificate it finds in its Secret when that is valid: so the Secret is created beforehand
with ours (whose server certificate names both their Services and 127.0.0.1), and its files
are put where a Pod would have the Secret mounted, the folder both hard-code
(``/tmp/k8s-webhook-server/serving-certs``: the same files for every session).
``start()`` returns once every controller is ready and its webhooks answer (a dry-run
create of an invalid object is refused by the webhook itself).

Used by the ``peers`` pytest marker (``tests/integration/test_peers.py``, run with
``pytest --peers -m peers``; plain ``make test`` deselects it), by ``benchmarks/peers.py``
and by ``python -m tests.cluster.harness --peers``; ``python tests/cluster/peers.py`` only
builds them (``make bench`` does that first).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: python tests/cluster/peers.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cluster import binaries
from tests.cluster.harness import Cluster, free_port


@dataclass(frozen=True)
class Peer:
    """One pinned upstream release and the controller command built from it."""

    name: str
    module: str
    version: str
    package: str  # relative to the module's folder
    binary: str

    @property
    def cache_dir(self) -> Path:
        return binaries.cache_root() / f"{self.name}-{self.version}"

    @property
    def path(self) -> Path:
        return self.cache_dir / self.binary

    def is_built(self) -> bool:
        return self.path.is_file()


# Kubeflow Trainer v2.0.0's go.mod requires sigs.k8s.io/jobset v0.8.2: the pair it is
# released and tested with. (The proxy serves these versions; it refuses to list some.)
JOBSET = Peer("jobset", "sigs.k8s.io/jobset", "v0.8.2", ".", "jobset-controller")
TRAINER = Peer(
    "kubeflow-trainer",
    "github.com/kubeflow/trainer/v2",
    "v2.0.0",
    "./cmd/trainer-controller-manager",
    "trainer-controller-manager",
)
TRAINING_OPERATOR = Peer(
    "training-operator",
    "github.com/kubeflow/training-operator",
    "v1.8.1",
    "./cmd/training-operator.v1",
    "training-operator",
)
PEERS = {p.name: p for p in (JOBSET, TRAINER, TRAINING_OPERATOR)}

TRAINER_NAMESPACE = "kubeflow-system"  # where Trainer's rotator keeps its Secret
TRAINING_OPERATOR_NAMESPACE = "kubeflow"  # the same for Training Operator (MY_POD_NAMESPACE)
# The rotators' fixed names (cmd/*/main.go flags' defaults, pkg/util/cert, pkg/cert).
TRAINER_CA = "kubeflow-trainer-ca"
TRAINER_SECRET = "kubeflow-trainer-webhook-cert"
TRAINER_SERVICE = "kubeflow-trainer-controller-manager"
TRAINER_WEBHOOKS = "validator.trainer.kubeflow.org"
TRAINING_OPERATOR_CA = "training-operator-ca"
TRAINING_OPERATOR_SECRET = "training-operator-webhook-cert"
TRAINING_OPERATOR_SERVICE = "training-operator"
TRAINING_OPERATOR_WEBHOOKS = "validator.training-operator.kubeflow.org"
JOBSET_WEBHOOKS = "jobset-webhooks"
# Where both rotators expect their Secret mounted (a constant in each, no flag).
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
PKI_VERSION = "v1"  # bump to make a new CA (the files are kept in the cache)


def module_dir(peer: Peer) -> Path:
    """The release's folder in the Go module cache (downloaded through the proxy once)."""
    go = _go(peer)
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{peer.module}@{peer.version}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),  # outside any module: no go.mod is read or written
    )
    if done.returncode != 0:
        raise SystemExit(
            f"error: cannot download {peer.module}@{peer.version} through the Go module "
            f"proxy:\n{done.stdout}{done.stderr}\ncheck GOPROXY and the network"
        )
    return Path(json.loads(done.stdout)["Dir"])


def _go(peer: Peer) -> str:
    go = shutil.which("go")
    if go is None:
        raise SystemExit(
            f"error: the Go toolchain is needed once to build {peer.name} {peer.version}; "
            "install Go >= 1.26 or point TORCHYARD_CACHE at a folder that holds it already"
        )
    return go


def build(peer: Peer, *, log: bool = True) -> Path:
    """Build ``peer``'s controller into its cache folder unless it is there already."""
    if peer.is_built():
        if log:
            print(f"[peers] {peer.name} {peer.version}: cached in {peer.cache_dir}", flush=True)
        return peer.path
    with binaries.one_maker(peer.cache_dir, f"[peers] {peer.name} {peer.version}" if log else None):
        if peer.is_built():
            return peer.path
        return _build(peer, log)


def _build(peer: Peer, log: bool) -> Path:
    source = module_dir(peer)
    peer.cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{peer.name}-", dir=peer.cache_dir.parent))
    # The release's own go.mod and go.sum pin every dependency; -mod=mod lets the build
    # read a module folder that carries no vendor/ (the module cache is read-only: nothing
    # is written there).
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false -mod=mod")
    started = time.monotonic()
    if log:
        print(f"[peers] building {peer.binary} ({peer.module} {peer.version}) ...", flush=True)
    try:
        subprocess.run(
            [
                _go(peer),
                "build",
                "-trimpath",
                "-ldflags",
                "-s -w",
                "-o",
                str(tmp / peer.binary),
                peer.package,
            ],
            cwd=source,
            env=env,
            check=True,
        )
        if peer.cache_dir.exists():
            shutil.rmtree(peer.cache_dir)
        tmp.rename(peer.cache_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if log:
        print(f"[peers] built {peer.binary} in {time.monotonic() - started:.0f}s", flush=True)
    return peer.path


def build_all(names: list[str] | None = None) -> dict[str, Path]:
    return {name: build(PEERS[name]) for name in (names or list(PEERS))}


def versions() -> str:
    """The peers' versions, as the benchmarks print them."""
    return ", ".join(f"{p.name} {p.version}" for p in PEERS.values())


# -- certificates -----------------------------------------------------------------------


def pki_dir() -> Path:
    """One CA and one serving certificate for every peer's webhooks, made once and kept:
    Trainer and Training Operator write the certificate to the same hard-coded folder
    (/tmp/k8s-webhook-server/serving-certs), so every session must hand them the same one."""
    folder = binaries.cache_root() / f"peers-pki-{PKI_VERSION}"
    if (folder / "tls.key").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".peers-pki-", dir=folder.parent))

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    # The rotators read RSA keys in PKCS#1 ("RSA PRIVATE KEY") only, and keep a CA only
    # when it verifies for its own name and outlives their 90-day lookahead.
    (tmp / "ca.cnf").write_text(
        "basicConstraints=critical,CA:TRUE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign\n"
        f"subjectAltName=DNS:{TRAINER_CA},DNS:{TRAINING_OPERATOR_CA}\n"
    )
    names = [
        "IP:127.0.0.1",
        "DNS:localhost",
        f"DNS:{TRAINER_SERVICE}.{TRAINER_NAMESPACE}.svc",
        f"DNS:{TRAINING_OPERATOR_SERVICE}.{TRAINING_OPERATOR_NAMESPACE}.svc",
    ]
    (tmp / "server.cnf").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(names)}\n"
    )
    openssl("genrsa", "-traditional", "-out", "ca.key", "2048")
    openssl(
        "req",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        f"/O=torchyard-peers/CN={TRAINER_CA}",
        "-out",
        "ca.csr",
    )
    openssl(
        "x509", "-req", "-in", "ca.csr", "-signkey", "ca.key", "-days", "3650",
        "-extfile", "ca.cnf", "-out", "ca.crt",
    )  # fmt: skip
    openssl("genrsa", "-traditional", "-out", "tls.key", "2048")
    openssl(
        "req", "-new", "-key", "tls.key", "-subj", "/CN=torchyard-peers-webhooks", "-out", "tls.csr"
    )
    openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "3650", "-extfile", "server.cnf", "-out", "tls.crt",
    )  # fmt: skip
    try:
        tmp.rename(folder)
    except OSError:  # another session made it meanwhile: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


# -- manifests (pure) -------------------------------------------------------------------


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def webhook_configuration(
    template: dict[str, Any], name: str, port: int, ca_bundle: str, *, pods_of: str | None = None
) -> dict[str, Any]:
    """A release's webhook configuration with every Service reference turned into
    ``https://127.0.0.1:<port><path>`` (our CA's bundle). ``pods_of``: the label that Pod
    webhooks select on (JobSet's release patches its Pod webhooks so; its raw manifest
    does not), so that other Pods never wait on them."""
    doc = json.loads(json.dumps(template))
    doc["metadata"] = {"name": name, "labels": {"torchyard.dev/test-peer": "true"}}
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
        hook["timeoutSeconds"] = 10
        if pods_of and any("pods" in r.get("resources", []) for r in hook.get("rules", [])):
            hook["objectSelector"] = {"matchExpressions": [{"key": pods_of, "operator": "Exists"}]}
    return doc


def cert_secret(namespace: str, name: str, pki: Path) -> dict[str, Any]:
    """The rotator's Secret, filled with our certificates (it keeps valid ones)."""
    data = {
        key: base64.b64encode((pki / key).read_bytes()).decode()
        for key in ("ca.crt", "ca.key", "tls.crt", "tls.key")
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": data,
    }


def mount_certs(
    pki: Path, folder: Path = CERT_DIR, keys: tuple[str, ...] = ("ca.crt", "tls.crt", "tls.key")
) -> None:
    """What the kubelet does with a certificate Secret in a Pod: its files in the folder
    a controller reads (by default the one Trainer and Training Operator read; their
    rotators only check that the files are there). Written by rename, so that a concurrent
    session never reads half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    for key in keys:
        data = (pki / key).read_bytes()
        target = folder / key
        if target.is_file() and target.read_bytes() == data:
            continue
        tmp = folder / f".{key}.{os.getpid()}"
        tmp.write_bytes(data)
        tmp.chmod(0o600)
        os.replace(tmp, target)


# -- running them -----------------------------------------------------------------------


def end_process(cluster: Cluster, binary: str) -> None:
    """Terminate (then kill, after 10 s) the cluster's process started from ``binary``."""
    proc = cluster.processes.pop(binary, None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def remove_webhooks(cluster: Cluster) -> None:
    """Delete the peers' webhook configurations (which would refuse their objects'
    writes once their controllers are gone)."""
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        cluster.kubectl("delete", kind, "-l", "torchyard.dev/test-peer=true", "--ignore-not-found")


class Peers:
    """The peers' controllers against ``cluster`` (processes of the cluster itself)."""

    def __init__(self, cluster: Cluster, names: tuple[str, ...] = tuple(PEERS)) -> None:
        unknown = [n for n in names if n not in PEERS]
        if unknown:
            raise ValueError(f"unknown peer(s) {unknown}; choose from {list(PEERS)}")
        if TRAINER.name in names and JOBSET.name not in names:
            raise ValueError("kubeflow-trainer needs jobset: name both")
        self.cluster = cluster
        self.names = names
        self.health: dict[str, int] = {}
        self.webhook_ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}

    def start(self) -> Peers:
        t0 = time.monotonic()
        for name in self.names:
            build(PEERS[name])
        self.timings["build"] = time.monotonic() - t0
        t1 = time.monotonic()
        pki = pki_dir()
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        dirs = {name: module_dir(PEERS[name]) for name in self.names}
        self._apply_crds(dirs)
        for name in self.names:
            self.health[name] = free_port()
            self.webhook_ports[name] = free_port()
        if JOBSET.name in self.names:
            src = dirs[JOBSET.name] / "config/components/webhook/manifests.yaml"
            for i, doc in enumerate(_docs(src)):
                self._apply(
                    webhook_configuration(
                        doc,
                        f"{JOBSET_WEBHOOKS}-{i}",
                        self.webhook_ports[JOBSET.name],
                        ca_bundle,
                        pods_of="jobset.sigs.k8s.io/jobset-name",
                    )
                )
            self._start_jobset(pki)
        if TRAINER.name in self.names:
            src = dirs[TRAINER.name] / "manifests/base/webhook/manifests.yaml"
            (doc,) = _docs(src)
            self._apply(
                webhook_configuration(
                    doc, TRAINER_WEBHOOKS, self.webhook_ports[TRAINER.name], ca_bundle
                )
            )
            self.cluster.create_namespace(TRAINER_NAMESPACE)
            self._apply(cert_secret(TRAINER_NAMESPACE, TRAINER_SECRET, pki))
            mount_certs(pki)
            self._start_trainer()
        if TRAINING_OPERATOR.name in self.names:
            src = dirs[TRAINING_OPERATOR.name] / "manifests/base/webhook/manifests.yaml"
            (doc,) = _docs(src)
            self._apply(
                webhook_configuration(
                    doc,
                    TRAINING_OPERATOR_WEBHOOKS,
                    self.webhook_ports[TRAINING_OPERATOR.name],
                    ca_bundle,
                )
            )
            self.cluster.create_namespace(TRAINING_OPERATOR_NAMESPACE)
            self._apply(cert_secret(TRAINING_OPERATOR_NAMESPACE, TRAINING_OPERATOR_SECRET, pki))
            mount_certs(pki)
            self._start_training_operator()
        for name in self.names:
            self.cluster.wait_for(
                f"{name} ready", lambda n=name: self._ready(n), timeout=180, interval=0.5
            )
        self._wait_webhooks()
        if TRAINER.name in self.names:
            runtime = dirs[TRAINER.name] / "manifests/base/runtimes/torch_distributed.yaml"
            for doc in _docs(runtime):
                self._apply(doc)
        self.timings["start"] = time.monotonic() - t1
        return self

    def stop(self) -> None:
        """End the controllers and remove their webhook configurations (which would
        otherwise refuse their objects' writes)."""
        for name in self.names:
            end_process(self.cluster, PEERS[name].binary)
        remove_webhooks(self.cluster)

    def __enter__(self) -> Peers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pieces ----------------------------------------------------------------------

    def _apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=torchyard-peers",
            "-f", "-", input=json.dumps(doc),
        )  # fmt: skip

    def _apply_crds(self, dirs: dict[str, Path]) -> None:
        files: list[Path] = []
        if JOBSET.name in dirs:
            files += sorted((dirs[JOBSET.name] / "config/components/crd/bases").glob("*.yaml"))
        if TRAINER.name in dirs:
            files += sorted((dirs[TRAINER.name] / "manifests/base/crds").glob("trainer.*.yaml"))
        if TRAINING_OPERATOR.name in dirs:
            files.append(
                dirs[TRAINING_OPERATOR.name] / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
            )
        names = []
        for f in files:
            for doc in _docs(f):
                doc.setdefault("metadata", {}).setdefault("labels", {})[
                    "torchyard.dev/test-peer"
                ] = "true"
                self._apply(doc)
                names.append(doc["metadata"]["name"])
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
        )

    def _start(self, peer: Peer, args: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.cluster.workdir / f"{peer.binary}.log", "wb")  # noqa: SIM115
        self.cluster.processes[peer.binary] = subprocess.Popen(
            [str(peer.path), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), **(env or {})),
            cwd=self.cluster.workdir,
            start_new_session=True,
        )

    def _start_jobset(self, pki: Path) -> None:
        config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {
                "port": self.webhook_ports[JOBSET.name],
                "host": "127.0.0.1",
                "certDir": str(pki),
            },
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health[JOBSET.name]}"},
        }
        path = self.cluster.workdir / "jobset-config.yaml"
        path.write_text(yaml.safe_dump(config))
        self._start(JOBSET, [f"--config={path}", "--zap-devel=false"])

    def _start_trainer(self) -> None:
        self._start(
            TRAINER,
            [
                f"--webhook-server-port={self.webhook_ports[TRAINER.name]}",
                f"--health-probe-bind-address=127.0.0.1:{self.health[TRAINER.name]}",
                "--metrics-bind-address=0",
                "--leader-elect=false",
            ],
        )

    def _start_training_operator(self) -> None:
        self._start(
            TRAINING_OPERATOR,
            [
                "--enable-scheme=pytorchjob",
                f"--webhook-server-port={self.webhook_ports[TRAINING_OPERATOR.name]}",
                f"--health-probe-bind-address=127.0.0.1:{self.health[TRAINING_OPERATOR.name]}",
                "--metrics-bind-address=0",
                "--leader-elect=false",
            ],
            env={"MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE},
        )

    def _ready(self, name: str) -> bool:
        url = f"http://127.0.0.1:{self.health[name]}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_webhooks(self) -> None:
        """Until each validating webhook itself refuses an invalid object (not the schema,
        not a connection error: the apiserver names the webhook in its message)."""
        probes = []
        if JOBSET.name in self.names:
            probes.append(
                (
                    "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets",
                    {
                        "apiVersion": "jobset.x-k8s.io/v1alpha2",
                        "kind": "JobSet",
                        "metadata": {"name": "peers-probe"},
                        # a success policy naming a job that does not exist: webhook says no
                        "spec": {
                            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["x"]},
                            "replicatedJobs": [
                                {
                                    "name": "a",
                                    "template": {
                                        "spec": {
                                            "template": {
                                                "spec": {
                                                    "containers": [{"name": "c", "image": "i"}]
                                                }
                                            }
                                        }
                                    },
                                }
                            ],
                        },
                    },
                    "vjobset.kb.io",
                )
            )
        if TRAINER.name in self.names:
            probes.append(
                (
                    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs",
                    {
                        "apiVersion": "trainer.kubeflow.org/v1alpha1",
                        "kind": "TrainJob",
                        # a DNS-1123 name that is no DNS-1035 label: only the webhook says no
                        "metadata": {"name": "1-peers-probe"},
                        "spec": {"runtimeRef": {"name": "torch-distributed"}},
                    },
                    "validator.trainjob.trainer.kubeflow.org",
                )
            )
        if TRAINING_OPERATOR.name in self.names:
            probes.append(
                (
                    "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs",
                    {
                        "apiVersion": "kubeflow.org/v1",
                        "kind": "PyTorchJob",
                        "metadata": {"name": "peers-probe"},
                        # two Masters pass the schema; the webhook says "must be 1"
                        "spec": {
                            "pytorchReplicaSpecs": {
                                "Master": {
                                    "replicas": 2,
                                    "template": {
                                        "spec": {"containers": [{"name": "pytorch", "image": "i"}]}
                                    },
                                }
                            }
                        },
                    },
                    "validator.pytorchjob.training-operator.kubeflow.org",
                )
            )
        for path, body, hook in probes:

            def refused(path: str = path, body: dict[str, Any] = body, hook: str = hook) -> bool:
                code, answer = self.cluster.request("POST", f"{path}?dryRun=All", body)
                return code in (400, 403, 422) and hook in json.dumps(answer)

            self.cluster.wait_for(f"webhook {hook} answering", refused, timeout=120, interval=0.5)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peers", nargs="*", help=f"any of {', '.join(PEERS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    try:
        build_all(args.peers or None)
    except subprocess.CalledProcessError as err:
        print(f"error: go build failed ({err})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
