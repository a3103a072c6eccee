"""Tiny exported models of several kinds, written as PT2 archives, for the programs tests.

An encoder classifier and two task variants of it (LoRA on a linear kept as separate A and B,
and a LoRA merged into one linear), a convolutional net and a small decoder LM, each a few tens
of KB of float32 parameters; the variants share every other tensor with the base byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

DIM, SEQ, VOCAB = 32, 8, 64


class Block(nn.Module):
    """A post-norm transformer-encoder block: 4-head self-attention, then a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.linear1, self.linear2 = nn.Linear(DIM, 64), nn.Linear(64, DIM)
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, 4, DIM // 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (DIM // 4) ** 0.5, -1) @ v
        x = self.norm1(x + self.o(a.transpose(1, 2).reshape(b, t, DIM)))
        return self.norm2(x + self.linear2(torch.nn.functional.gelu(self.linear1(x))))


class Encoder(nn.Module):
    """Two transformer-encoder blocks and a classification head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, 5)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(1))


class LoraLinear(nn.Module):
    """``base(x) + scale * B(A(x))`` with A and B parameters of their own."""

    def __init__(self, base: nn.Linear, rank: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features, generator=g) * 0.1)
        self.lora_B = nn.Parameter(torch.randn(base.out_features, rank, generator=g) * 0.1)

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T


def lora_separate() -> Encoder:
    """The encoder with LoRA rank 4 on the first block's first MLP linear, A and B kept apart."""
    m = Encoder()
    m.blocks[0].linear1 = LoraLinear(m.blocks[0].linear1, 4, 1)
    return m


def lora_merged() -> Encoder:
    """The encoder with a rank-2 LoRA merged into the head's weight."""
    m = Encoder()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        m.head.weight += torch.randn(5, 2, generator=g) @ torch.randn(2, DIM, generator=g) * 0.1
    return m


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 4),
        )

    def forward(self, x):
        return self.body(x)


class TinyLM(nn.Module):
    """A one-block causal decoder: token ids in, next-token logits and the last hidden state out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, DIM))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1))

    def forward(self, ids):
        x = self.embed(ids)
        a, _ = self.attn(x, x, x, attn_mask=self.mask, need_weights=False)
        x = self.norm(x + a)
        x = x + self.mlp(x)
        return self.lm_head(x), x[:, -1]


def export(model: nn.Module, *inputs) -> torch.export.ExportedProgram:
    return torch.export.export(model.eval(), inputs)


def encoder_input() -> torch.Tensor:
    return torch.randn(1, SEQ, DIM, generator=torch.Generator().manual_seed(10))


@dataclass
class Archives:
    folder: Path
    base: Path  # torch.export.save of the encoder
    tasks: Path  # package_pt2: models "separate" (LoRA as A, B) and "merged"
    conv: Path
    lm: Path
    extra: Path  # another variant, for `add`: LoRA on the second block's linear2


def write_archives(folder: Path) -> Archives:
    """Every archive the programs tests read, with the models' sample inputs."""
    from torch.export.pt2_archive._package import package_pt2

    folder.mkdir(parents=True, exist_ok=True)
    a = Archives(
        folder, folder / "base.pt2", folder / "tasks.pt2", folder / "conv.pt2", folder / "lm.pt2", folder / "extra.pt2"
    )
    x = encoder_input()
    torch.export.save(export(Encoder(), x), a.base)
    package_pt2(a.tasks, exported_programs={"separate": export(lora_separate(), x), "merged": export(lora_merged(), x)})
    torch.export.save(export(ConvNet(), torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(11))), a.conv)
    torch.export.save(
        export(TinyLM(), torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(12))), a.lm
    )
    extra = Encoder()
    extra.blocks[1].linear2 = LoraLinear(extra.blocks[1].linear2, 2, 5)
    torch.export.save(export(extra, x), a.extra)
    return a


PROGRAMS_YAML = """output_dir: {out}
programs:
  - name: base
    pt2: {a.base}
  - name: separate
    pt2: {a.tasks}
    model: separate
  - name: merged
    pt2: {a.tasks}
    model: merged
  - name: conv
    pt2: {a.conv}
  - name: lm
    pt2: {a.lm}
"""
