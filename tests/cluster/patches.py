"""Source patches applied to a pinned upstream release before it is built (binaries.py).

One patch so far, to KWOK v0.8.0, which stands in for the kubelet of every fake node:

**KWOK deletes a Pod by name; the kubelet by uid.** KWOK ends a Pod that is being
deleted with ``DELETE pods/<name>`` (grace period 0) from a job it queued on an earlier
watch event of that Pod, keyed by namespace/name only. A controller that re-creates a Pod
under the same name as soon as the old one is gone (torchyard's gang restart: node Pods
are ``<run>-<rank>`` in every attempt) then has its NEW Pod deleted by a late job of the
old one, and creates it again: a 64-Pod gang restart created 87 to 311 Pods instead of
64 (tests/integration/test_gang_restart.py). The kubelet never does this: its status
manager deletes with ``Preconditions{UID: pod.UID}`` (k8s.io/kubernetes v1.37.2,
pkg/kubelet/status/status_manager.go), so a late delete of a Pod that is gone fails with
409 and touches the new one not at all. The patch makes KWOK's pod controller delete the
same way, and take a 409 (another Pod holds the name now) or 404 (gone already) as done
instead of retrying.

A patched tool is built from a copy of its module (``go mod download``'s folder, copied
and patched) through a ``replace`` directive in a temporary copy of the wrapper's go.mod
(``go build -modfile``): the wrapper module and its go.sum stay as they are, and the
patch's name is part of the cache folder's, so a stock build is never taken for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Patch:
    """Exact text replacements in one Go module's files (each ``old`` must occur once)."""

    name: str  # part of the cache folder's name
    module: str  # the Go module path the wrapper requires
    # (file relative to the module root, old text, new text)
    edits: tuple[tuple[str, str, str], ...]


KWOK_UID_DELETE = Patch(
    name="uid-delete",
    module="sigs.k8s.io/kwok",
    edits=(
        (
            "pkg/kwok/controllers/pod_controller.go",
            '\tcorev1 "k8s.io/api/core/v1"\n',
            '\tcorev1 "k8s.io/api/core/v1"\n\tapierrors "k8s.io/apimachinery/pkg/api/errors"\n',
        ),
        (
            "pkg/kwok/controllers/pod_controller.go",
            "\terr := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, deleteOpt)\n"
            "\tif err != nil {\n\t\treturn err\n\t}\n",
            "\t// torchyard: as the kubelet, delete this Pod (its uid), never a namesake\n"
            "\topt := *metav1.NewDeleteOptions(0)\n"
            "\topt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))\n"
            "\terr := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opt)\n"
            "\tif apierrors.IsNotFound(err) || apierrors.IsConflict(err) {\n"
            "\t\treturn nil // gone, or the name is another Pod's now\n\t}\n"
            "\tif err != nil {\n\t\treturn err\n\t}\n",
        ),
    ),
)


def apply_edits(root: Path, patch: Patch) -> None:
    """Apply ``patch`` to the module copy at ``root``; an edit that does not match once
    (another release) is an error that says so."""
    for relative, old, new in patch.edits:
        path = root / relative
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(
                f"error: patch {patch.name} does not fit {patch.module} ({relative}: the text "
                f"to replace occurs {text.count(old)} times, not once); update "
                "tests/cluster/patches.py for this release"
            )
        path.write_text(text.replace(old, new))


def patched_modfile(go: str, wrapper: Path, patch: Patch, env: dict[str, str], work: Path) -> Path:
    """A copy of ``wrapper``'s go.mod (and go.sum) in ``work`` whose ``patch.module`` is
    replaced by a patched copy of its source; pass it to ``go build -modfile``."""
    found = subprocess.run(
        [go, "mod", "download", "-json", patch.module],
        cwd=wrapper,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    source = Path(json.loads(found.stdout)["Dir"])
    copy = work / "src"
    shutil.copytree(source, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the module cache is read-only
    apply_edits(copy, patch)
    modfile = work / "go.mod"
    modfile.write_text(f"{(wrapper / 'go.mod').read_text()}\nreplace {patch.module} => {copy}\n")
    shutil.copy(wrapper / "go.sum", work / "go.sum")
    return modfile
