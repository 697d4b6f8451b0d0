"""Write each node's own data file and the server's evaluation file (`mymodel`'s synthetic data: 10 features,
3 classes, a label skew per client). On real machines each node has its own file already: copy only client-K.npz to
node K.

    python prepare.py FOLDER [--clients 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mymodel import client_data, simulated_test

from bayesadmm.flower.loaders import save_tensors


def prepare(folder: Path, clients: int = 3) -> tuple[list[Path], Path]:
    files = [save_tensors(Path(folder) / f"client-{k}.npz", *client_data(k)) for k in range(clients)]
    return files, save_tensors(Path(folder) / "test.npz", *simulated_test())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--clients", type=int, default=3)
    args = parser.parse_args()
    files, test = prepare(args.folder, args.clients)
    print("\n".join(f"node {k}: {path}" for k, path in enumerate(files)) + f"\nserver: {test}")
