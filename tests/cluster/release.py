"""The release: the images, their SBOMs and provenance, and the Helm chart, built and
pushed the same way by ``make images`` / ``make chart``, by the release workflow
(``.github/workflows/release.yml``) and by the node test that installs the pushed chart
(``tests/node/test_release_on_node.py``).

One version: ``torchyard.__version__``. The chart's ``version`` and ``appVersion`` must
equal it (``chart`` refuses otherwise; ``tests/unit/test_release.py`` checks it), the
operator image is tagged with it, and the curated PyTorch images with the torch version
their Dockerfile pins (``2.15-cpu``, ``2.15-cuda13``): the tags the chart's defaults name.

- ``images``: each image is built with buildah from the local ``python`` base
  (``tests/cluster/buildah.py``: Debian packages, no Docker daemon, nothing pulled but
  PyPI wheels), cached by a hash of its inputs; its SBOM (SPDX JSON) is written by syft,
  built from the Go module proxy like the harness's other tools, and its provenance (an
  in-toto statement: the image's digest, the Dockerfile, the base, the commit) beside it.
  ``images.json`` lists each image's reference, digest, archive, SBOM and provenance.
- ``--push HOST``: the images go to ``HOST/<repository>:<tag>`` with the Environment
  builder's registry client; the digest is the archive's manifest digest.
- ``chart``: ``helm package``, then with ``--push HOST`` ``helm push`` to
  ``oci://HOST/torchyard/charts``.

The CUDA image (PyPI's torch with its CUDA wheels, about 3 GB) is built only with
``--cuda``; the CPU image needs PyTorch's CPU index (``TORCH_INDEX_URL``), which this
project's test machines cannot reach: ``--only torchyard`` builds the operator alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

if not __package__:  # run as a script: the repository root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.cluster import binaries, buildah
from tests.cluster.registry import push_archive_with
from torchyard import __version__, envbuild

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "torchyard"
# Where the chart's defaults pull from, and where the chart is pushed below a registry.
DEFAULT_REGISTRY = "ghcr.io"
CHART_PATH = "torchyard/charts"
OUT = REPO / "build" / "release"
SOURCE = "git+https://github.com/torchyard/torchyard"
SYFT_ENV = {"SYFT_CHECK_FOR_APP_UPDATE": "false"}


class ReleaseError(SystemExit):
    """A release step cannot go on; the message says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


@dataclass(frozen=True)
class ReleaseImage:
    """One image of the release: ``name`` is its buildah.DOCKERFILES key."""

    name: str
    repository: str  # below the registry host
    tag: str

    def ref(self, registry: str = DEFAULT_REGISTRY) -> str:
        return f"{registry}/{self.repository}:{self.tag}"


def torch_minor(dockerfile: str) -> str:
    """``2.15`` of the ``torch==2.15.0`` a Dockerfile installs."""
    found = set(re.findall(r"\btorch==(\d+\.\d+)\.\d+", dockerfile))
    if len(found) != 1:
        raise ReleaseError(f"expected one torch==X.Y.Z pin in the Dockerfile, found {found}")
    return found.pop()


def release_images(repo: Path = REPO) -> list[ReleaseImage]:
    """Every image the release builds, in the order it builds them."""

    def torch(name: str) -> str:
        return torch_minor((repo / buildah.DOCKERFILES[name]).read_text())

    return [
        ReleaseImage("torchyard", "torchyard/torchyard", __version__),
        ReleaseImage("pytorch-cpu", "torchyard/pytorch", f"{torch('pytorch-cpu')}-cpu"),
        ReleaseImage("pytorch-cuda", "torchyard/pytorch", f"{torch('pytorch-cuda')}-cuda13"),
    ]


def chart_versions(chart: Path = CHART) -> tuple[str, str]:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    return str(meta["version"]), str(meta["appVersion"])


def check_chart_version(chart: Path = CHART) -> str:
    version, app = chart_versions(chart)
    if version != __version__ or app != __version__:
        raise ReleaseError(
            f"{chart / 'Chart.yaml'}: version {version} and appVersion {app} must both be "
            f"torchyard's version {__version__} (operator/torchyard/__init__.py)"
        )
    return version


# -- images ---------------------------------------------------------------------------


def archive_digest(archive: Path) -> str:
    """The manifest digest of the one image in an OCI layout archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ReleaseError(f"{archive}: no index.json")
        [entry] = json.load(member)["manifests"]
    return str(entry["digest"])


def git_commit(repo: Path = REPO) -> str:
    result = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def provenance(image: ReleaseImage, digest: str, base: str, repo: Path = REPO) -> dict[str, Any]:
    """An in-toto statement (SLSA provenance v1) of one built image."""
    dockerfile = buildah.DOCKERFILES[image.name]
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": image.ref(), "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://torchyard.dev/release/buildah/v1",
                "externalParameters": {"dockerfile": dockerfile, "version": __version__},
                "resolvedDependencies": [
                    {"uri": SOURCE, "digest": {"gitCommit": git_commit(repo)}},
                    {"uri": base},
                ],
            },
            "runDetails": {"builder": {"id": "https://torchyard.dev/release/make-images"}},
        },
    }


def write_sbom(archive: Path, out: Path) -> Path:
    """The SPDX JSON SBOM of an image archive, by syft (OS packages and Python ones)."""
    syft = binaries.build(binaries.TOOLS["syft"]) / "syft"
    result = subprocess.run(
        [str(syft), "scan", f"oci-archive:{archive}", "--quiet", "-o", f"spdx-json={out}"],
        env=dict(os.environ, **SYFT_ENV),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise ReleaseError(f"syft failed on {archive}:\n{result.stderr[-3000:]}")
    return out


def build_images(
    names: list[str], out: Path = OUT, *, sbom: bool = True, log: bool = True
) -> list[dict[str, Any]]:
    """Build ``names`` (their SBOMs and provenance into ``out``); the entries of images.json."""
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for image in [i for i in release_images() if i.name in names]:
        made = buildah.ensure_project_image(image.name, log=log)
        digest = archive_digest(made.archive)
        base = f"torchyard.local/python (tests/cluster/images.py), built as {made.ref}"
        statement = out / f"{image.name}.provenance.json"
        statement.write_text(json.dumps(provenance(image, digest, base), indent=2) + "\n")
        entry = {
            "name": image.name,
            "ref": image.ref(),
            "repository": image.repository,
            "tag": image.tag,
            "digest": digest,
            "archive": str(made.archive),
            "provenance": str(statement),
        }
        if sbom:
            entry["sbom"] = str(write_sbom(made.archive, out / f"{image.name}.spdx.json"))
        built.append(entry)
        if log:
            print(f"[release] {image.ref()}@{digest}", flush=True)
    (out / "images.json").write_text(json.dumps(built, indent=2) + "\n")
    return built


def push_images(
    built: list[dict[str, Any]], registry: str, *, auth: dict[str, Any], insecure: bool
) -> list[str]:
    """Push built images to ``registry`` (a host, or a host and a path prefix);
    returns ``registry/repository:tag@digest`` of each."""
    host, _, prefix = registry.partition("/")
    client = envbuild.Registry(host, auth, insecure=insecure, timeout=600)
    pushed = []
    for entry in built:
        repository = f"{prefix}/{entry['repository']}" if prefix else entry["repository"]
        digest = push_archive_with(client, Path(entry["archive"]), repository, entry["tag"])
        if digest != entry["digest"]:
            raise ReleaseError(f"{entry['name']}: pushed {digest}, built {entry['digest']}")
        pushed.append(f"{host}/{repository}:{entry['tag']}@{digest}")
    return pushed


# -- the chart -------------------------------------------------------------------------


def helm(*args: str, home: Path | None = None) -> str:
    binary = binaries.build(binaries.TOOLS["helm"]) / "helm"
    env = dict(os.environ)
    if home is not None:  # a private config and cache (the tests: nothing in $HOME)
        env.update(
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )
    result = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, env=env, timeout=300
    )
    if result.returncode != 0:
        raise ReleaseError(f"helm {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def package_chart(out: Path = OUT, chart: Path = CHART, home: Path | None = None) -> Path:
    version = check_chart_version(chart)
    out.mkdir(parents=True, exist_ok=True)
    helm("package", str(chart), "--destination", str(out), home=home)
    return out / f"torchyard-{version}.tgz"


def push_chart(package: Path, registry: str, *, plain_http: bool, home: Path | None = None) -> str:
    """``helm push`` to ``oci://registry/torchyard/charts``; returns the chart's address."""
    target = f"oci://{registry}/{CHART_PATH}"
    helm("push", str(package), target, *(["--plain-http"] if plain_http else []), home=home)
    return f"{target}/torchyard"


# -- the command line -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["images", "chart", "version"])
    parser.add_argument(
        "--only",
        action="append",
        choices=list(buildah.DOCKERFILES),
        help="build only these images (repeatable; default: all but the CUDA one)",
    )
    parser.add_argument("--cuda", action="store_true", help="build the CUDA image too (~3 GB)")
    parser.add_argument("--no-sbom", action="store_true", help="skip the SBOMs")
    parser.add_argument("--push", metavar="REGISTRY", help="push to this registry host")
    parser.add_argument("--plain-http", action="store_true", help="the registry speaks HTTP")
    parser.add_argument("--auth", metavar="FILE", help="docker config.json with push credentials")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = parser.parse_args(argv)
    if args.step == "version":
        print(__version__)
        return 0
    if args.step == "chart":
        package = package_chart(args.out)
        print(f"[release] {package}")
        if args.push:
            print(f"[release] {push_chart(package, args.push, plain_http=args.plain_http)}")
        return 0
    names = args.only or [n for n in buildah.DOCKERFILES if args.cuda or n != "pytorch-cuda"]
    built = build_images(names, args.out, sbom=not args.no_sbom)
    if args.push:
        auth = envbuild.load_auth(args.auth)
        for ref in push_images(built, args.push, auth=auth, insecure=args.plain_http):
            print(f"[release] pushed {ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
