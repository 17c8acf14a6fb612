"""What a run is: ``ScriptRunConfig`` (source folder, script or command, arguments,
compute target, environment, time limit) and ``PyTorchConfiguration`` (nodes and
processes, the TrainingRun's ``distribution``) and ``MpiConfiguration`` (nodes and
slots per node: ``distribution.type: mpi``, node 0 runs mpirun). Read by
``Experiment.submit``; tested in tests/unit/sdk/test_azureml_arguments.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchyard.sdk.azureml import datasets
from torchyard.sdk.azureml.common import TorchyardSdkError, refuse
from torchyard.sdk.azureml.compute import ComputeTarget
from torchyard.sdk.azureml.environments import Environment


@dataclass
class PyTorchConfiguration:
    """``process_count`` processes over ``node_count`` nodes; with ``command=`` in the
    ScriptRunConfig the command runs once per node (it starts the processes itself)."""

    communication_backend: str = "Nccl"
    process_count: int | None = None
    node_count: int = 1

    def __post_init__(self) -> None:
        if str(self.communication_backend).lower() != "nccl":
            raise TorchyardSdkError(
                f"communication_backend={self.communication_backend!r} is not passed to the "
                "processes here: your script chooses it in "
                "torch.distributed.init_process_group(backend=...); leave "
                "communication_backend out"
            )
        if not isinstance(self.node_count, int) or self.node_count < 1:
            raise TorchyardSdkError(
                f"node_count must be a whole number >= 1, not {self.node_count!r}"
            )
        if self.process_count is not None and (
            not isinstance(self.process_count, int) or self.process_count < 1
        ):
            raise TorchyardSdkError(
                f"process_count must be a whole number >= 1, not {self.process_count!r}"
            )


@dataclass
class MpiConfiguration:
    """``process_count_per_node`` MPI ranks on each of ``node_count`` nodes: a TrainingRun
    of ``distribution.type: mpi`` (node 0 runs OpenMPI's mpirun over the node Pods; the
    ranks get OMPI_COMM_WORLD_RANK/SIZE from it)."""

    process_count_per_node: int = 1
    node_count: int = 1

    def __post_init__(self) -> None:
        for name in ("process_count_per_node", "node_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TorchyardSdkError(f"{name} must be a whole number >= 1, not {value!r}")


class ScriptRunConfig:
    def __init__(
        self,
        source_directory: str,
        script: str | None = None,
        arguments: list[Any] | None = None,
        run_config: Any = None,
        _telemetry_values: Any = None,
        compute_target: ComputeTarget | str | None = None,
        environment: Environment | None = None,
        distributed_job_config: PyTorchConfiguration | MpiConfiguration | None = None,
        resume_from: Any = None,
        max_run_duration_seconds: int | None = None,
        command: list[Any] | str | None = None,
        docker_runtime_config: Any = None,
    ) -> None:
        if script is None and command is None:
            raise TorchyardSdkError("ScriptRunConfig needs script= or command=")
        if script is not None and command is not None:
            raise TorchyardSdkError(
                "ScriptRunConfig takes script= or command=, not both: put the script into "
                "the command (command=['python', 'train.py', ...])"
            )
        refuse(
            "ScriptRunConfig",
            {
                "run_config": (run_config, None),
                "_telemetry_values": (_telemetry_values, None),
                "resume_from": (resume_from, None),
                "docker_runtime_config": (docker_runtime_config, None),
            },
            "a RunConfiguration's parts are ScriptRunConfig's own arguments here "
            "(environment=, compute_target=, distributed_job_config=, "
            "max_run_duration_seconds=); shared memory and the like are TrainingRun spec "
            "fields (resources.shmSize), set with torchyard submit; to resume, restore your "
            "checkpoint in the script (run.download_file)",
        )
        if distributed_job_config is not None and not isinstance(
            distributed_job_config, (PyTorchConfiguration, MpiConfiguration)
        ):
            raise TorchyardSdkError(
                f"distributed_job_config={type(distributed_job_config).__name__} is not "
                "supported: use PyTorchConfiguration(process_count=..., node_count=...) or "
                "MpiConfiguration(process_count_per_node=..., node_count=...)"
            )
        if max_run_duration_seconds is not None and (
            not isinstance(max_run_duration_seconds, int) or max_run_duration_seconds < 1
        ):
            raise TorchyardSdkError(
                f"max_run_duration_seconds must be a whole number >= 1, not "
                f"{max_run_duration_seconds!r}"
            )
        self.source_directory = source_directory
        self.script = script
        self.arguments = [str(a) for a in (arguments or [])]
        # dataset.as_named_input(...).as_mount() among the arguments: the run's inputs
        self.inputs = datasets.inputs_of(list(arguments or []))
        self.compute_target = compute_target
        self.environment = environment
        self.distributed_job_config = distributed_job_config
        self.max_run_duration_seconds = max_run_duration_seconds
        self.command = command.split() if isinstance(command, str) else command

    def _distribution(self) -> dict[str, Any]:
        dist = self.distributed_job_config
        if dist is None:
            return {"type": "none", "nodeCount": 1, "processCountPerNode": 1}
        if isinstance(dist, MpiConfiguration):
            return {
                "type": "mpi",
                "nodeCount": dist.node_count,
                "processCountPerNode": dist.process_count_per_node,
            }
        nodes = dist.node_count
        procs = dist.process_count or nodes
        if procs % nodes:
            raise TorchyardSdkError(
                f"process_count={procs} does not split evenly over node_count={nodes}"
            )
        return {
            "type": "pytorch",
            "nodeCount": nodes,
            "processCountPerNode": procs // nodes,
            "launch": "node" if self.command else "process",
        }


__all__ = ["MpiConfiguration", "PyTorchConfiguration", "ScriptRunConfig"]
