"""Export a small image classifier and two task variants of it into PT2 archives.

    python examples/pt2/export_models.py examples/pt2/models

writes models/vision.pt2 (the base, torch.export.save) and models/tasks.pt2 (two models in one
archive, package_pt2): "birds", LoRA rank 4 on every block's q and v kept as separate A and B
parameters, and "cars", a LoRA merged into the head. Both variants keep every other tensor of
the base byte for byte: `lora-share build examples/pt2/vision.yaml` stores those once, in
foundation.ptd. Each archive also holds the sample input it was exported with, which the build
runs to check each lowered program against the archive's own ExportedProgram.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

DIM, HEADS, CLASSES = 64, 4, 10


class Block(nn.Module):
    """A transformer-encoder block: self-attention, then a GELU MLP, each with a residual and a norm."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (DIM // HEADS) ** 0.5, -1) @ v
        x = self.norm1(x + self.o(a.transpose(1, 2).reshape(b, t, DIM)))
        return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))


class Classifier(nn.Module):
    """A convolution stem (32x32 RGB -> 8x8 patches), four encoder blocks, a linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, DIM, 4, stride=4)
        self.blocks = nn.Sequential(*(Block() for _ in range(4)))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, image):
        x = self.stem(image).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x).mean(1))


class LoRA(nn.Module):
    """``base(x) + B(A(x))``: the fine-tuned task's weights beside the untouched base linear."""

    def __init__(self, base: nn.Linear, rank: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features, generator=g) * 0.05)
        self.lora_B = nn.Parameter(torch.randn(base.out_features, rank, generator=g) * 0.05)

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T


def birds() -> Classifier:
    model = Classifier()
    for i, block in enumerate(model.blocks):
        block.q, block.v = LoRA(block.q, 4, 10 + i), LoRA(block.v, 4, 20 + i)
    return model


def cars() -> Classifier:
    model = Classifier()
    g = torch.Generator().manual_seed(30)
    with torch.no_grad():  # a rank-8 LoRA merged into the head: one changed tensor
        model.head.weight += torch.randn(CLASSES, 8, generator=g) @ torch.randn(8, DIM, generator=g) * 0.05
    return model


def main(folder: Path) -> None:
    from torch.export.pt2_archive._package import package_pt2

    folder.mkdir(parents=True, exist_ok=True)
    image = (torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
    export = lambda model: torch.export.export(model.eval(), image)  # noqa: E731
    torch.export.save(export(Classifier()), folder / "vision.pt2")
    package_pt2(folder / "tasks.pt2", exported_programs={"birds": export(birds()), "cars": export(cars())})
    import numpy as np

    np.save(folder / "image.npy", image[0].numpy())
    print(f"wrote {folder / 'vision.pt2'}, {folder / 'tasks.pt2'} and {folder / 'image.npy'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "examples/pt2/models"))
