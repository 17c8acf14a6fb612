"""Build the control-plane binaries the integration tests run, once per version.

The Go wrapper modules under ``tests/cluster/go/`` pin each upstream release (their
``go.sum`` files make the build reproducible); this module builds their commands
through the Go module proxy into a cache folder **outside the clone**:

    ${TORCHYARD_CACHE:-~/.cache/torchyard}/<tool>-<version>/<binary>

A finished folder is never rebuilt, so a second ``make test`` (or CI in a fresh
clone on the same machine) builds nothing. A build goes to a temporary folder that
is renamed into place, so an interrupted build leaves no half-filled cache entry.

Called by ``make tools`` (``python tests/cluster/binaries.py``) and by the pytest
harness in ``tests/cluster/harness.py``. The real test node's binaries (``NODE_TOOLS``:
kubelet, kube-proxy, CoreDNS, crictl) are built only when named
(``python tests/cluster/binaries.py kubernetes-node coredns cri-tools``) or by
``tests/cluster/realnode.py``, so the control-plane build stays as long as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script (make tools): the repository root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.cluster.patches import KWOK_UID_DELETE, Patch, patched_modfile

GO_DIR = Path(__file__).resolve().parent / "go"

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
REGISTRY_VERSION = "v3.1.2"
HELM_VERSION = "v4.3.1"
COREDNS_VERSION = "v1.15.0"
CRI_TOOLS_VERSION = "v1.37.0"
SYFT_VERSION = "v1.57.1"
# No tagged release of SeaweedFS is a Go module version; the proxy's pseudo-version pins one commit.
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"


@dataclass(frozen=True)
class Tool:
    """One pinned upstream release and the commands built from it."""

    name: str
    version: str
    module_dir: str
    # binary name -> Go package path
    commands: dict[str, str]
    ldflags: tuple[str, ...] = field(default_factory=tuple)
    patch: Patch | None = None  # built from a patched copy of the module (patches.py)

    @property
    def cache_dir(self) -> Path:
        tag = f"-{self.patch.name}" if self.patch else ""
        return cache_root() / f"{self.name}-{self.version}{tag}"

    def path(self, binary: str) -> Path:
        return self.cache_dir / binary

    def is_built(self) -> bool:
        return all(self.path(b).is_file() for b in self.commands)


def _k8s_version_ldflags(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


TOOLS: dict[str, Tool] = {
    "etcd": Tool(
        name="etcd",
        version=ETCD_VERSION,
        module_dir="etcd",
        commands={"etcd": "go.etcd.io/etcd/server/v3"},
    ),
    "kwok": Tool(
        name="kwok",
        version=KWOK_VERSION,
        module_dir="kwok",
        commands={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION}",),
        patch=KWOK_UID_DELETE,  # deletes a Pod by uid, as the kubelet does
    ),
    "registry": Tool(
        name="registry",
        version=REGISTRY_VERSION,
        module_dir="registry",
        commands={"registry": "github.com/distribution/distribution/v3/cmd/registry"},
        ldflags=(f"-X github.com/distribution/distribution/v3/version.version={REGISTRY_VERSION}",),
    ),
    "helm": Tool(
        name="helm",
        version=HELM_VERSION,
        module_dir="helm",
        commands={"helm": "helm.sh/helm/v4/cmd/helm"},
        ldflags=(
            f"-X helm.sh/helm/v4/internal/version.version={HELM_VERSION}",
            "-X helm.sh/helm/v4/internal/version.gitTreeState=clean",
        ),
    ),
    "kubernetes": Tool(
        name="kubernetes",
        version=KUBERNETES_VERSION,
        module_dir="kubernetes",
        commands={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
        ldflags=_k8s_version_ldflags(KUBERNETES_VERSION),
    ),
    # The real test node (tests/cluster/realnode.py): same module, version and ldflags as
    # the control plane, a folder of its own so adding it rebuilds nothing above.
    "kubernetes-node": Tool(
        name="kubernetes-node",
        version=KUBERNETES_VERSION,
        module_dir="kubernetes",
        commands={
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        ldflags=_k8s_version_ldflags(KUBERNETES_VERSION),
    ),
    "coredns": Tool(
        name="coredns",
        version=COREDNS_VERSION,
        module_dir="coredns",
        commands={"coredns": "github.com/coredns/coredns"},
    ),
    "cri-tools": Tool(
        name="cri-tools",
        version=CRI_TOOLS_VERSION,
        module_dir="critools",
        commands={"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
        ldflags=(f"-X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION}",),
    ),
    # The SBOM of each release image (tests/cluster/release.py, `make images`).
    "syft": Tool(
        name="syft",
        version=SYFT_VERSION,
        module_dir="syft",
        commands={"syft": "github.com/anchore/syft/cmd/syft"},
        ldflags=(f"-X main.version={SYFT_VERSION}",),
    ),
    # The S3 store the inputs tests fetch s3:// inputs from (tests/cluster/s3.py).
    "seaweedfs": Tool(
        name="seaweedfs",
        version=SEAWEEDFS_VERSION,
        module_dir="seaweedfs",
        commands={"weed": "github.com/seaweedfs/seaweedfs/weed"},
    ),
}
# Built only on request (by name, or by the real node, the release or the S3 fixture),
# not by a bare `make tools`.
NODE_TOOLS = ("kubernetes-node", "coredns", "cri-tools")
RELEASE_TOOLS = ("syft",)
ON_REQUEST = (*NODE_TOOLS, *RELEASE_TOOLS, "seaweedfs")


def cache_root() -> Path:
    root = os.environ.get("TORCHYARD_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "torchyard"


def build(tool: Tool, *, log: bool = True) -> Path:
    """Build ``tool`` into its cache folder unless it is there already. One process builds
    a tool at a time: another that wants it meanwhile (a second clone, the other pytest
    run of ``make test``) waits for that build instead of making its own."""
    if tool.is_built():
        if log:
            print(f"[tools] {tool.name} {tool.version}: cached in {tool.cache_dir}", flush=True)
        return tool.cache_dir
    with one_maker(tool.cache_dir, f"[tools] {tool.name} {tool.version}" if log else None):
        if tool.is_built():
            return tool.cache_dir
        return _build(tool, log)


@contextlib.contextmanager
def one_maker(entry: Path, label: str | None) -> Iterator[None]:
    """Held while this process makes the cache entry ``entry`` (a Go tool, a peer, an
    image): a process that wants the same entry meanwhile waits here (saying so after
    ``label``), then finds it made."""
    root = cache_root()
    name = "+".join(entry.relative_to(root).parts) if entry.is_relative_to(root) else entry.name
    locks = root / ".locks"  # not beside the entries, whose folders some code lists
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if label:
                print(f"{label}: another process makes it; waiting", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(tool: Tool, log: bool) -> Path:
    go = shutil.which("go")
    if go is None:
        raise SystemExit(
            "error: the Go toolchain is needed once to build the test control plane "
            f"({tool.name} {tool.version}); install Go >= 1.26 or point TORCHYARD_CACHE "
            "at a folder that already holds the binaries"
        )
    tool.cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tool.name}-", dir=tool.cache_dir.parent))
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false -mod=readonly")
    try:
        modfile: list[str] = []
        if tool.patch is not None:
            work = tmp / ".patched"
            work.mkdir()
            found = patched_modfile(go, GO_DIR / tool.module_dir, tool.patch, env, work)
            modfile = ["-modfile", str(found)]
        ldflags = " ".join(("-s", "-w", *tool.ldflags))
        for binaries, output in _invocations(tool, tmp):
            started = time.monotonic()
            names = ", ".join(binaries)
            if log:
                print(f"[tools] building {names} ({tool.name} {tool.version}) ...", flush=True)
            subprocess.run(
                [go, "build", *modfile, "-trimpath", "-ldflags", ldflags, *output],
                cwd=GO_DIR / tool.module_dir,
                env=env,
                check=True,
            )
            if log:
                print(f"[tools] built {names} in {time.monotonic() - started:.0f}s", flush=True)
        shutil.rmtree(tmp / ".patched", ignore_errors=True)
        if tool.cache_dir.exists():  # a partial folder from an older layout
            shutil.rmtree(tool.cache_dir)
        tmp.rename(tool.cache_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tool.cache_dir


def _invocations(tool: Tool, out: Path) -> list[tuple[list[str], list[str]]]:
    """The ``go build`` runs that make ``tool``'s binaries in ``out``: one for all of them
    where each is named as Go names it (the package's last element), so that their links
    run side by side; otherwise one per binary."""
    if len(tool.commands) > 1 and all(
        binary == package.rsplit("/", 1)[-1] for binary, package in tool.commands.items()
    ):
        return [(list(tool.commands), ["-o", f"{out}/", *tool.commands.values()])]
    return [([b], ["-o", str(out / b), package]) for b, package in tool.commands.items()]


def build_all(names: list[str] | None = None) -> dict[str, Path]:
    default = [name for name in TOOLS if name not in ON_REQUEST]
    return {name: build(TOOLS[name]) for name in (names or default)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "tools",
        nargs="*",
        help=f"any of {', '.join(TOOLS)} (default: all but {', '.join(ON_REQUEST)})",
    )
    parser.add_argument("--print-dir", action="store_true", help="print each tool's folder")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tools if t not in TOOLS]
    if unknown:
        parser.error(f"unknown tool(s) {', '.join(unknown)}; choose from {', '.join(TOOLS)}")
    try:
        dirs = build_all(args.tools or None)
    except subprocess.CalledProcessError as err:
        print(f"error: go build failed ({err})", file=sys.stderr)
        return 1
    if args.print_dir:
        for name, path in dirs.items():
            print(f"{name}={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
