"""Transfer learning on birds: the training script of Azure ML's "Train PyTorch models at
scale" guide, made to run offline and distributed.

The guide fine-tunes an ImageNet-pretrained ResNet on chicken/turkey photos it downloads.
Nothing can be downloaded here, so the script (1) pre-trains a small convolutional
backbone on a related task, classifying procedurally drawn shapes, (2) freezes it and
(3) fine-tunes a new head on procedurally drawn chicken and turkey silhouettes
(``birds_data.py``). Same arguments as the guide: ``--num_epochs``, ``--output_dir``,
``--learning_rate``, ``--momentum``; ``--data_dir`` reads the birds from a folder's
``birds.npz`` (``images``, ``labels``) instead, such as a run's input
(``--data_dir $TORCHYARD_INPUT_BIRDS``, ``birds_data.save``); ``--init_model`` fine-tunes
a model this script saved before (its ``model.pt``, or a folder holding it, such as a
``model://`` input's: ``--init_model $TORCHYARD_INPUT_MODEL``) instead of pre-training a
backbone, and says which file it loaded, with its sha256 and its parameters' checksum.
Each fine-tuning epoch rank 0 reports ``val_accuracy`` and ``best_val_acc`` through
``torchyard.progress`` (the metrics a Sweep's objective names). When torchyard made the
run an MLflow run (it sets MLFLOW_RUN_ID in every process) and the image has the MLflow
client, rank 0 also logs each epoch's loss (``pretrain_loss``, ``finetune_loss``, the step
counted over both phases) and the run's summary (``loss_first``, ``loss_final``,
``final_val_accuracy``, ``seconds``) with ``mlflow.log_metric``, into that one run.

Distributed with DistributedDataParallel when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU),
from the rank contract torchyard sets (MASTER_ADDR, RANK, LOCAL_RANK, ...), exactly as
under ``torchrun``. Rank 0 writes ``model.pt``, ``metrics.json``, ``history.json`` and,
when TORCHYARD_EXPORT_ONNX=1 (``outputs.register.exportOnnx``), ``model.onnx``.

With the TrainingRun's spec.checkpoints, every rank saves its state at the end of an epoch
through ``torchyard.checkpoint`` (a step is an epoch, pre-training's first: every
``interval`` epochs, and once more when its Pod is being stopped), and a restarted gang
continues from the newest complete checkpoint (TORCHYARD_RESUME_FROM); without it,
nothing is saved.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import io
import json
import os
import time
from pathlib import Path

import birds_data
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # shipped with the launcher into every node Pod, and installed in local mode
    from torchyard import checkpoint, progress
except ImportError:  # run by hand, outside torchyard: no checkpoints, no progress lines
    checkpoint = progress = None

TRACKING = None  # the mlflow module on rank 0 of a tracked run (see tracking())


def tracking() -> object | None:
    """The ``mlflow`` module when torchyard made this run an MLflow run and the image has
    the client; else None, saying why when the run is tracked but the client is missing."""
    if "MLFLOW_RUN_ID" not in os.environ:
        return None
    try:
        import mlflow
    except ImportError:
        print("MLFLOW_RUN_ID is set but this image has no mlflow client: not logging", flush=True)
        return None
    return mlflow


def save(step: int, model: nn.Module, opt: torch.optim.Optimizer, history: list) -> None:
    """This rank's state after epoch ``step`` (counted over both phases), when it is due."""
    if checkpoint is None or not checkpoint.should_save(step):
        return
    rank = int(os.environ.get("RANK", "0"))
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "history": history,
        "rng": torch.get_rng_state(),  # the DataLoaders draw their seeds from it
    }
    torch.save(state, Path(checkpoint.save_dir(step)) / f"rank-{rank}.pt")
    checkpoint.done(step)


def resumed(rank: int) -> dict | None:
    """This rank's state from the checkpoint torchyard resumes from, if any."""
    folder = os.environ.get("TORCHYARD_RESUME_FROM")
    if not folder:
        return None
    # This run's own file (older torch's weights_only loader refuses optimizer state).
    state = torch.load(Path(folder) / f"rank-{rank}.pt", weights_only=False)
    print(f"rank {rank}: resumed after epoch {state['step']}", flush=True)
    return state


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x - 0.5)


class Classifier(nn.Module):
    def __init__(self, backbone: Backbone, classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def setup() -> tuple[int, int, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if world > 1:
        dist.init_process_group(backend=backend, init_method="env://")
    return rank, world, device


def mean_across_ranks(value: float, device: torch.device) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def train(
    model: nn.Module,
    data: TensorDataset,
    epochs: int,
    lr: float,
    momentum: float,
    device: torch.device,
    rank: int,
    world: int,
    label: str,
    history: list[dict[str, float]] | None = None,
    evaluate: callable | None = None,
    first_step: int = 0,
    state: dict | None = None,
) -> None:
    """``first_step``: the epochs before this phase; ``state``: a checkpoint of this phase
    to continue from (its epochs are skipped)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # Adam (betas[0] = the guide's momentum) converges in few steps on this small data.
    opt = torch.optim.Adam(params, lr=lr, betas=(momentum, 0.999))
    start = 0
    if state is not None:
        unwrapped(model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"]) - first_step
        torch.set_rng_state(state["rng"])  # as it was after that epoch
        if history is not None:
            history[:] = state["history"]
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)
        model.train()
        total, count = 0.0, 0
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            opt.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            opt.step()
            total += float(loss.item()) * len(labels)
            count += len(labels)
        loss = mean_across_ranks(total / max(count, 1), device)
        extra = evaluate() if evaluate else {}
        if history is not None:
            history.append({"epoch": epoch + 1, "loss": loss, **extra})
        if rank == 0:
            shown = " ".join(f"{k} {v:.3f}" for k, v in extra.items())
            print(f"{label} epoch {epoch + 1}/{epochs} loss {loss:.4f} {shown}", flush=True)
            if history is not None:
                report(history, epochs)
            if TRACKING is not None:
                TRACKING.log_metric(f"{label}_loss", loss, step=first_step + epoch + 1)
        save(first_step + epoch + 1, unwrapped(model), opt, history or [])


def report(history: list[dict[str, float]], epochs: int) -> None:
    """The fine-tuning epoch's metrics as a progress line (the epoch is the step), with
    the best validation accuracy so far (``best_val_acc``, the guide's sweep objective)."""
    if progress is None:
        return
    last = history[-1]
    best = max(h["val_accuracy"] for h in history)
    progress.report(
        int(last["epoch"]),
        total=epochs,
        loss=last["loss"],
        val_accuracy=last["val_accuracy"],
        best_val_acc=best,
    )


def unwrapped(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


@torch.no_grad()
def accuracy(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device
) -> float:
    model.eval()
    predictions = model(images.to(device)).argmax(dim=1).cpu()
    return float((predictions == labels).float().mean())


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def load_model(path: str, model: nn.Module) -> None:
    """``model``'s weights from ``path``: a ``model.pt`` this script saved, or a folder
    holding one (a ``model://`` input); says which file, its sha256 and the checksum."""
    found = Path(path)
    if found.is_dir():
        found = found / "model.pt"
    data = found.read_bytes()
    saved = torch.load(io.BytesIO(data), map_location="cpu")
    model.load_state_dict(saved["state_dict"])
    digest = hashlib.sha256(data).hexdigest()
    print(f"loaded {found} sha256 {digest} param-checksum {checksum(model)}", flush=True)


def export_onnx(model: nn.Module, path: Path) -> None:
    """``model`` as ONNX (input ``image``, output ``logits``; the batch size may vary),
    with the TorchScript exporter on every torch: torch 2.x must be told
    ``dynamo=False`` (its default became the dynamo exporter, which needs onnxscript),
    while torch 1.x has no such argument and refuses it."""
    model.eval()
    options: dict[str, object] = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, birds_data.SIZE, birds_data.SIZE),),
        str(path),
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        **options,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_epochs", type=int, default=10, help="fine-tuning epochs")
    parser.add_argument("--output_dir", type=str, default="./outputs")
    parser.add_argument("--learning_rate", type=float, default=0.003)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--pretrain_epochs", type=int, default=8)
    parser.add_argument("--images", type=int, default=400, help="bird images (80%% train)")
    parser.add_argument("--data_dir", type=str, default="", help="a folder with birds.npz")
    parser.add_argument(
        "--init_model", type=str, default="", help="fine-tune this model.pt (or a folder's)"
    )
    args = parser.parse_args()

    global TRACKING
    started = time.time()
    rank, world, device = setup()
    if rank == 0:
        TRACKING = tracking()
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"training on {device} ({name}), world size {world}", flush=True)
    torch.manual_seed(0)  # every rank starts from the same weights
    state = resumed(rank)
    done = int(state["step"]) if state is not None else 0

    # 1. Pre-train a backbone on the related task (shapes), unless a saved model has one.
    if args.init_model:
        args.pretrain_epochs = 0
    backbone = Backbone()
    print(f"rank {rank}: first training step at {time.time():.3f}", flush=True)
    # else the saved model or the checkpoint holds the pre-trained backbone
    if done <= args.pretrain_epochs and not args.init_model:
        shape_x, shape_y = birds_data.shapes(1600, seed=0)
        pretrain = Classifier(backbone, len(birds_data.SHAPES)).to(device)
        train(
            DistributedDataParallel(pretrain) if world > 1 else pretrain,
            TensorDataset(torch.from_numpy(shape_x), torch.from_numpy(shape_y)),
            args.pretrain_epochs,
            0.003,
            0.9,
            device,
            rank,
            world,
            "pretrain",
            state=state if state is not None and done <= args.pretrain_epochs else None,
        )

    # 2. Freeze it; 3. fine-tune a new head on the birds.
    for p in backbone.parameters():
        p.requires_grad = False
    if args.data_dir:
        bird_x, bird_y = birds_data.load(args.data_dir)
        if rank == 0:
            print(f"read {len(bird_y)} bird images from {args.data_dir}", flush=True)
    else:
        bird_x, bird_y = birds_data.birds(args.images, seed=1)
    split = int(0.8 * len(bird_y))
    train_set = TensorDataset(torch.from_numpy(bird_x[:split]), torch.from_numpy(bird_y[:split]))
    val_x, val_y = torch.from_numpy(bird_x[split:]), torch.from_numpy(bird_y[split:])
    model = Classifier(backbone, len(birds_data.BIRDS))
    if args.init_model:
        load_model(args.init_model, model)
    model.to(device)
    wrapped: nn.Module = DistributedDataParallel(model) if world > 1 else model
    history: list[dict[str, float]] = []
    train(
        wrapped,
        train_set,
        args.num_epochs,
        args.learning_rate,
        args.momentum,
        device,
        rank,
        world,
        "finetune",
        history,
        evaluate=lambda: {"val_accuracy": accuracy(model, val_x, val_y, device)},
        first_step=args.pretrain_epochs,
        state=state if state is not None and done > args.pretrain_epochs else None,
    )

    print(f"param-checksum rank {rank} {checksum(model)}", flush=True)
    if rank == 0:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.cpu()
        torch.save(
            {
                "state_dict": model.state_dict(),
                "classes": list(birds_data.BIRDS),
                "input_shape": [3, birds_data.SIZE, birds_data.SIZE],
            },
            out / "model.pt",
        )
        metrics = {
            "loss_first": history[0]["loss"],
            "loss_final": history[-1]["loss"],
            "val_accuracy": history[-1]["val_accuracy"],
            "world_size": world,
            "seconds": time.time() - started,
        }
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        if TRACKING is not None:
            summary = {k: metrics[k] for k in ("loss_first", "loss_final", "seconds")}
            TRACKING.log_metrics({**summary, "final_val_accuracy": metrics["val_accuracy"]})
        (out / "history.json").write_text(json.dumps(history, indent=2))
        if os.environ.get("TORCHYARD_EXPORT_ONNX") == "1":
            export_onnx(model, out / "model.onnx")
            print("exported outputs/model.onnx", flush=True)
        print(f"val accuracy {metrics['val_accuracy']:.3f}; saved {out / 'model.pt'}", flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
