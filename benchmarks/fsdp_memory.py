"""Memory per rank: FSDP2 (`zoo train --shard full`'s sharding) against DDP (`--shard none`),
on CPU with gloo (issue 48).

    .venv/bin/python benchmarks/fsdp_memory.py [--card smollm2-135m] [--ranks 2] [--json F]

Each mode runs under `torchrun --nproc_per_node R` (127.0.0.1, a free port): every rank builds
the card's model (random weights, seed 0), wraps it as `zoo train` does (DDP, or one FSDP unit
per zoo layer then the root: zoo/training/sharding.py), and runs --steps steps of Adam on
random token ids. Each rank reports the bytes it holds of the parameters, of the gradients
(after a backward) and of Adam's state (local shards of DTensors), its resident memory after
the steps, and its peak resident memory (which includes building the whole model: the zoo
builds it on every rank before sharding). The machine's CPU flags come first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from export.cpu import cpu_flags  # noqa: E402

MIB = 1 << 20


def local_bytes(tensors: list) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def resident_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def worker(mode: str, card_name: str, steps: int, block: int, report: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from registry.catalog import open_catalog
    from zoo.assemble import build_model
    from zoo.training.sharding import shard_model

    dist.init_process_group("gloo")
    card = open_catalog(()).get(card_name)
    model = build_model(card, seed=0)
    if mode == "full":
        shard_model(model)
        trained = model
    else:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(dist.get_rank())
    gradients = 0
    for _ in range(steps):
        ids = torch.randint(0, card["vocab_size"], (1, block + 1), generator=generator)
        logits = trained(ids[:, :-1])[0]
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gradients = local_bytes([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.step()
    figures = {
        "parameters": local_bytes(list(model.parameters())),
        "gradients": gradients,
        "adam": local_bytes([t for state in optimizer.state.values() for t in state.values()
                             if isinstance(t, torch.Tensor)]),
        "resident_after": resident_bytes(),
        "peak_resident": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, figures)
    if dist.get_rank() == 0:
        report.write_text(json.dumps(every))
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(mode: str, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "ranks.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   "--nproc_per_node", str(args.ranks), __file__, "--worker", mode,
                   "--card", args.card, "--steps", str(args.steps), "--block", str(args.block),
                   "--report", str(report)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        subprocess.run(command, check=True, env=env, cwd=ROOT, timeout=1800)
        return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--card", default="smollm2-135m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", choices=("none", "full"), help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.card, args.steps, args.block, args.report)
        return
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; CPU flags: "
          f"{' '.join(cpu_flags())}", flush=True)
    results = {mode: run(mode, args) for mode in ("none", "full")}
    keys = ("parameters", "gradients", "adam", "resident_after", "peak_resident")
    print(f"\n{args.card}, {args.ranks} ranks, MiB per rank (rank 0; the largest rank in "
          "brackets)")
    print(f"{'':16}{'DDP (--shard none)':>22}{'FSDP (--shard full)':>22}{'FSDP / DDP':>12}")
    for key in keys:
        ddp = [rank[key] / MIB for rank in results["none"]]
        fsdp = [rank[key] / MIB for rank in results["full"]]
        print(f"{key:16}{ddp[0]:>12.1f} [{max(ddp):>7.1f}]{fsdp[0]:>12.1f} [{max(fsdp):>7.1f}]"
              f"{max(fsdp) / max(ddp):>12.2f}")
    if args.json:
        args.json.write_text(json.dumps({"card": args.card, "ranks": args.ranks,
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
