"""tests/cluster/patches.py: the KWOK build deletes a Pod by uid, as the kubelet does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import binaries, patches

# The lines of KWOK v0.8.0's pod_controller.go the patch rewrites, as they are upstream.
UPSTREAM = """import (
\tcorev1 "k8s.io/api/core/v1"
\tmetav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func (c *PodController) deleteResource(ctx context.Context, pod *corev1.Pod) error {
\terr := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, deleteOpt)
\tif err != nil {
\t\treturn err
\t}
\treturn nil
}
"""


def module(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pkg/kwok/controllers/pod_controller.go"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_the_kwok_patch_deletes_with_the_pods_uid_and_takes_a_namesake_as_done(
    tmp_path: Path,
) -> None:
    path = module(tmp_path, UPSTREAM)
    patches.apply_edits(tmp_path, patches.KWOK_UID_DELETE)
    text = path.read_text()
    assert "opt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))" in text
    assert "Delete(ctx, pod.Name, opt)" in text and "deleteOpt)" not in text
    assert "apierrors.IsNotFound(err) || apierrors.IsConflict(err)" in text
    assert '\tapierrors "k8s.io/apimachinery/pkg/api/errors"\n' in text


def test_a_patch_that_does_not_fit_the_release_says_what_to_update(tmp_path: Path) -> None:
    module(tmp_path, UPSTREAM.replace("deleteOpt)", "options)"))
    with pytest.raises(SystemExit, match=r"occurs 0 times, not once.*tests/cluster/patches.py"):
        patches.apply_edits(tmp_path, patches.KWOK_UID_DELETE)


def test_the_patched_kwok_has_a_cache_folder_of_its_own() -> None:
    kwok = binaries.TOOLS["kwok"]
    assert kwok.patch is patches.KWOK_UID_DELETE
    assert kwok.cache_dir.name == f"kwok-{binaries.KWOK_VERSION}-uid-delete"
    assert binaries.TOOLS["etcd"].cache_dir.name == f"etcd-{binaries.ETCD_VERSION}"
