"""Whether stacking matmuls that share an input pays: x @ W1, x @ W2, x @ W3 against one x @ [W1 W2
W3] split afterwards (what a horizontal-fusion rewrite would do to attention's q, k and v
projections or an MLP's gate and up projections). Timed side by side (korch.plan.runtime.interleave),
medians per shape; ratio > 1 means stacking is faster.

    python benchmarks/stacked_matmul.py [--device cpu|cuda] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from korch.plan.runtime import interleave

# (rows, inner, columns per matmul, matmuls): decode and prefill of small and BERT-sized layers
SHAPES = [
    (1, 512, 512, 3),
    (16, 512, 512, 3),
    (128, 512, 128, 3),
    (128, 512, 512, 3),
    (128, 768, 768, 3),
    (128, 512, 1376, 2),
    (2048, 256, 256, 3),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}")
    print(f"{'rows x inner x cols x n':>24} {'separate ms':>12} {'stacked ms':>11} {'ratio':>6}")
    generator = torch.Generator().manual_seed(0)
    for rows, inner, cols, n in SHAPES:
        x = torch.randn(rows, inner, generator=generator).to(args.device)
        ws = [torch.randn(inner, cols, generator=generator).to(args.device) for _ in range(n)]
        stacked = torch.cat(ws, 1)
        systems = {
            "separate": lambda x=x, ws=ws: [x @ w for w in ws],
            "stacked": lambda x=x, w=stacked, cols=cols: (x @ w).split(cols, 1),
        }
        for fn in systems.values():
            fn()
        rounds = interleave(systems, args.rounds, 0.02, args.device, round_pause_s=0.05)
        ms = {name: statistics.median(t for r in rs for t in r) for name, rs in rounds.items()}
        shape = f"{rows} x {inner} x {cols} x {n}"
        ratio = ms["separate"] / ms["stacked"]
        print(f"{shape:>24} {ms['separate']:12.4f} {ms['stacked']:11.4f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
