"""Write each node's own data file and the server's evaluation file (synthetic, 10 features, 3 classes, a label
skew per client). On real machines each node has its own file already: copy only client-K.npz to node K.

    python prepare.py FOLDER [--clients 3] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bayesadmm.flower.loaders import save_tensors


def prepare(folder: Path, clients: int = 3, seed: int = 0) -> tuple[list[Path], Path]:
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(3, 10, generator=g)

    def draw(n: int, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.multinomial(weights, n, replacement=True, generator=g)
        return centres[y] + torch.randn(n, 10, generator=g), y

    files = []
    for k in range(clients):
        weights = torch.full((3,), 0.2)
        weights[k % 3] = 1.0  # each client sees mostly one class
        files.append(save_tensors(Path(folder) / f"client-{k}.npz", *draw(200 + 50 * k, weights)))
    return files, save_tensors(Path(folder) / "test.npz", *draw(600, torch.ones(3)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    files, test = prepare(args.folder, args.clients, args.seed)
    print("\n".join(f"node {k}: {path}" for k, path in enumerate(files)) + f"\nserver: {test}")
