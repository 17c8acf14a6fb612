"""KServe's InferenceService CRD for the test control plane, from KServe's Go module.

No KServe controller runs here: the tests need its CRD only, to check that what
torchyard generates for an OnlineEndpoint with ``backend: KServe`` is an InferenceService
the apiserver accepts (``kubectl apply --dry-run=server``) and that the operator's
server-side apply of it goes through. The release's module (``github.com/kserve/kserve``,
pinned below) is fetched through the Go module proxy once (``go mod download``, the Go
module cache keeps it; about 64 MB) and ``config/crd/full/serving.kserve.io_inferenceservices.yaml``
is read from it. Used by tests/integration/test_endpoints_kserve.py.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.cluster import peers
from tests.cluster.harness import Cluster

# The newest release the Go module proxy serves here (its Standard deployment mode, the
# raw Deployment one, is the default).
KSERVE = peers.Peer("kserve", "github.com/kserve/kserve", "v0.20.0", "./cmd/manager", "manager")
CRD = "config/crd/full/serving.kserve.io_inferenceservices.yaml"
NAME = "inferenceservices.serving.kserve.io"
GROUP_VERSION = "serving.kserve.io/v1beta1"


def crd_file() -> Path:
    """The release's InferenceService CRD (downloaded through the Go module proxy once)."""
    return peers.module_dir(KSERVE) / CRD


def install(cluster: Cluster) -> None:
    """Apply the CRD (server-side: it is 2 MB) and wait until it is served."""
    doc = yaml.safe_load(crd_file().read_text())
    assert doc["metadata"]["name"] == NAME, doc["metadata"]["name"]
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=torchyard-tests",
        "-f", str(crd_file()),
    )  # fmt: skip

    # not kubectl wait: it fails on a CRD whose status has no conditions yet (just applied)
    def established() -> bool:
        code, body = cluster.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{NAME}"
        )
        status = body.get("status") if code == 200 else None
        conditions = (status or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    cluster.wait_for(f"CRD {NAME} established", established, timeout=60)
    # Established is not yet served: wait until the resource lists
    cluster.wait_for(
        "InferenceServices served",
        lambda: cluster.request("GET", f"/apis/{GROUP_VERSION}/inferenceservices")[0] == 200,
        timeout=60,
    )


def uninstall(cluster: Cluster) -> None:
    cluster.kubectl("delete", "crd", NAME, "--wait=true", "--timeout=60s", check=False)
