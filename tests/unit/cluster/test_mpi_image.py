"""The ``pytorch`` test image carries OpenMPI and mpi4py (Debian packages) for MPI runs,
and adding them changed its cache key, so a cached image without them is not reused."""

from __future__ import annotations

from tests.cluster import images


def test_the_training_image_has_openmpi_and_mpi4py() -> None:
    assert {"openmpi-bin", "python3-mpi4py"} <= set(images.TORCH_PACKAGES)


def test_the_mpi_packages_are_part_of_the_image_key() -> None:
    without = tuple(p for p in images.TORCH_PACKAGES if p not in images.MPI_PACKAGES)
    old = images._debian_image(
        "pytorch", without, "bookworm", "http://m/debian", images.TORCHRUN_BUG, images.TORCHRUN_FIX
    )
    assert images.pytorch_image("bookworm", "http://m/debian").key != old.key
