"""Train a small energy model on an nvalchemi store with DALIDataLoader and torch.distributed.

Each rank reads its own shard (taken from the process group), uses its own GPU (LOCAL_RANK) when
there is one, and DistributedDataParallel keeps the replicas in step. The model embeds atomic
numbers, adds a per-atom MLP on distances to the structure's centre, and sums atoms per structure
(``index_add`` over ``batch_idx``) to predict the energy.

    torchrun --nproc-per-node 2 examples/train_distributed.py STORE --epochs 2

``--report FILE`` writes, per rank, the store indices it saw in each epoch, its losses and a checksum
of its parameters (the tests use it to check sharding and gradient synchronisation).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dali_alchemi import Batch, DALIDataLoader


class EnergyModel(torch.nn.Module):
    """Per-atom features pooled per structure into an energy."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(120, hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden + 1, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, 1))

    def forward(self, batch: Batch) -> torch.Tensor:
        graph = batch.batch_idx.long()
        centre = torch.zeros(batch.num_graphs, 3, device=batch.positions.device)
        centre.index_add_(0, graph, batch.positions)
        counts = torch.diff(batch.batch_ptr).clamp(min=1).unsqueeze(-1).to(centre.dtype)
        radius = (batch.positions - (centre / counts)[graph]).norm(dim=-1, keepdim=True)
        per_atom = self.mlp(torch.cat([self.embed(batch.atomic_numbers.long()), radius], dim=-1)).squeeze(-1)
        energy = torch.zeros(batch.num_graphs, device=per_atom.device, dtype=per_atom.dtype)
        return energy.index_add(0, graph, per_atom)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="path or URL of an nvalchemi store")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="DALI worker processes per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--report", type=Path, help="write a JSON report per rank (RANK is appended)")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.manual_seed(0)  # identical initial weights on every rank
    loader = DALIDataLoader(
        args.store, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.workers,
        fields=["atomic_numbers", "positions", "energy"],
    )  # fmt: skip
    model = EnergyModel().to(loader.device)
    ddp = DistributedDataParallel(model, device_ids=[loader.device.index] if use_cuda else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    seen: dict[int, list[int]] = {}
    losses: list[float] = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        seen[epoch] = []
        for batch in loader:
            loss = torch.nn.functional.mse_loss(ddp(batch), batch.energy.squeeze(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen[epoch] += batch.sample_indices.tolist()
            losses.append(float(loss.detach()))
        if rank == 0:
            print(f"epoch {epoch}: {len(loader)} batches per rank, last loss {losses[-1]:.4f}", flush=True)
    loader.close()

    if args.report is not None:
        checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
        report = {"rank": rank, "world": world, "seen": seen, "losses": losses, "checksum": checksum}
        Path(f"{args.report}.{rank}").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
