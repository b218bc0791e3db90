"""The models and data the notebooks share: matmuls, an MLP, a CNN, a small GPT, images, a text corpus.

Pure torch + Pillow: nothing is downloaded. Datasets are module-level classes so DataLoader workers can
pickle them under spawn/forkserver (a class defined in a notebook cell cannot be).
"""
from __future__ import annotations

import io
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageEnhance
from torch.utils.data import Dataset

from ..measuring.dtypes import torch_dtype
from .fused_loss import linear_cross_entropy


def _positive_int(**kwargs: object) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive integer")


# ---------------------------------------------------------------- matmuls and elementwise

def random_matmul_inputs(m: int, n: int, k: int, dtype: torch.dtype | str = torch.float32,
                         device: torch.device | str | None = None, seed: int | None = 0
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random operands A (m×k) and B (k×n): never zeros, which run faster than real data on tensor cores."""
    _positive_int(m=m, n=n, k=k)
    dtype, device = torch_dtype(dtype, allowed=("fp32", "fp16", "bf16")), torch.device(device or "cpu")
    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    # Scale by 1/sqrt(k) so products stay O(1) and FP16 cannot overflow at large k.
    a = torch.randn(m, k, device=device, dtype=dtype, generator=gen) / math.sqrt(k)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
    return a, b


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The guide's hand-written GELU (§3.2): a chain of unfused elementwise ops, one kernel each in eager mode."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# ---------------------------------------------------------------- small models

class MLP(nn.Sequential):
    """`depth` hidden layers of Linear + GELU, then a Linear to `d_out`."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, depth: int = 2):
        _positive_int(d_in=d_in, d_hidden=d_hidden, d_out=d_out, depth=depth)
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(d_in if i == 0 else d_hidden, d_hidden), nn.GELU()]
        super().__init__(*layers, nn.Linear(d_hidden, d_out))


def _conv_bn_relu(c_in: int, c_out: int) -> list[nn.Module]:
    # No conv bias: BatchNorm right after it has its own shift.
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]


class SmallCNN(nn.Module):
    """Three stages of conv-bn-relu pairs with pooling, global average pool and a linear head; any H×W >= 4."""

    def __init__(self, num_classes: int = 10, width: int = 32, in_channels: int = 3):
        super().__init__()
        _positive_int(num_classes=num_classes, width=width, in_channels=in_channels)
        w = width
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, w), *_conv_bn_relu(w, w), nn.MaxPool2d(2),
            *_conv_bn_relu(w, 2 * w), *_conv_bn_relu(2 * w, 2 * w), nn.MaxPool2d(2),
            *_conv_bn_relu(2 * w, 4 * w), *_conv_bn_relu(4 * w, 4 * w), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


# ---------------------------------------------------------------- GPT (nanoGPT-style)

@dataclass
class GPTConfig:
    """Sizes of a GPT; the default is GPT-2 small with the vocabulary padded to a multiple of 64 (50304)."""

    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    dropout: float = 0.0
    bias: bool = False

    def __post_init__(self):
        _positive_int(vocab_size=self.vocab_size, n_layer=self.n_layer, n_head=self.n_head,
                      n_embd=self.n_embd, block_size=self.block_size)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} must be in [0, 1)")

    @classmethod
    def smoke(cls, **overrides) -> GPTConfig:
        """A tiny GPT that trains in milliseconds on a CPU (for tests and smoke runs)."""
        return cls(**{**dict(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64), **overrides})

    @classmethod
    def gpt2_small(cls, **overrides) -> GPTConfig:
        """GPT-2 small (124M parameters): 12 layers, 12 heads, 768 wide, 1024 context."""
        return cls(**{**dict(vocab_size=50304, n_layer=12, n_head=12, n_embd=768, block_size=1024), **overrides})


ATTENTION_IMPLS = ("sdpa", "manual")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; `attn` picks the fused SDPA kernel or the explicit softmax(QKᵀ/√d)V."""

    def __init__(self, cfg: GPTConfig, attn: str = "sdpa"):
        super().__init__()
        self.n_head, self.dropout, self.attn = cfg.n_head, cfg.dropout, attn
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout, self.resid_dropout = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        # Not persistent: checkpoints are the same for both implementations.
        mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        else:  # materializes the B×H×T×T score matrix: memory traffic the fused kernel avoids
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.causal_mask[:, :, :T, :T], float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) with a 4x GELU MLP."""

    def __init__(self, cfg: GPTConfig, attn: str = "sdpa"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, attn)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A nanoGPT-style decoder: token + position embeddings, `n_layer` blocks, final LayerNorm, tied lm_head."""

    def __init__(self, config: GPTConfig | None = None, attn: str = "sdpa", fused_loss: bool = False):
        super().__init__()
        self.config = cfg = config or GPTConfig()
        self.fused_loss = fused_loss  # lm_head + cross-entropy in one pass (gpulab.workloads.fused_loss); no logits returned
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
        self.attn = attn
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                # GPT-2: scale residual projections so the residual stream's variance does not grow with depth.
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @property
    def attn(self) -> str:
        """The attention implementation, "sdpa" or "manual"; settable on a built model."""
        return self._attn

    @attn.setter
    def attn(self, value: str) -> None:
        if value not in ATTENTION_IMPLS:
            raise ValueError(f"attn={value!r} is not supported; allowed: {', '.join(ATTENTION_IMPLS)}")
        self._attn = value
        for block in self.blocks:
            block.attn.attn = value

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; `non_embedding` leaves out the position embeddings (token ones are tied to lm_head)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits (B, T, vocab) for token ids `idx` (B, T), and the cross-entropy loss when `targets` is given.

        With `fused_loss` and targets, the logits are not kept (None is returned in their place): the loss and
        its gradient come from `gpulab.workloads.fused_loss.linear_cross_entropy`.
        """
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        if self.fused_loss and targets is not None:
            h = self.ln_f(x)
            return None, linear_cross_entropy(h.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1))
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


# ---------------------------------------------------------------- synthetic images with a real decode cost

_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics, as real pipelines use
_FORMATS = {"jpeg": ("JPEG", "jpg"), "jpg": ("JPEG", "jpg"), "png": ("PNG", "png")}


def _make_image(index: int, label: int, size: int, seed: int) -> Image.Image:
    """One deterministic image: a class-tinted noisy background with a few random shapes on top."""
    rng = random.Random(seed * 1_000_003 + index)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    hue = (40 + 97 * label) % 256  # class-dependent tint, so the labels are learnable
    base = torch.tensor([hue, (hue * 7) % 256, 255 - hue], dtype=torch.int16).view(1, 1, 3)
    noise = torch.randint(-48, 48, (size, size, 3), generator=gen, dtype=torch.int16)
    pixels = (base + noise).clamp(0, 255).to(torch.uint8)
    img = Image.frombytes("RGB", (size, size), pixels.numpy().tobytes())
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(2, 6)):
        x0, y0 = rng.randrange(size), rng.randrange(size)
        box = (x0, y0, x0 + rng.randint(4, size // 2), y0 + rng.randint(4, size // 2))
        color = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
    return img


def denormalize(x: torch.Tensor) -> torch.Tensor:
    """A normalized (3, H, W) image tensor from SyntheticImageDataset back to (H, W, 3) in [0, 1], to show it."""
    mean, std = torch.tensor(_MEAN).view(3, 1, 1), torch.tensor(_STD).view(3, 1, 1)
    return (x.detach().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0)


class SyntheticImageDataset(Dataset):
    """Image files on disk, decoded and augmented on the CPU per item: a data pipeline with real CPU cost.

    The images are written once into `root` (deterministic per `seed`) and reused; an item is a PIL decode, a random
    resized crop, a flip and colour jitter, as a normalized (3, size, size) tensor and its label."""

    def __init__(self, root: str | os.PathLike, n_images: int = 2048, size: int = 64, num_classes: int = 10,
                 fmt: str = "jpeg", seed: int = 0, augment: bool = True):
        self.paths = [str(p) for p in self.generate(root, n_images, size, seed, num_classes=num_classes, fmt=fmt)]
        self.labels = [int(Path(p).stem.rsplit("_c", 1)[1]) for p in self.paths]  # label is in the file name
        self.size, self.num_classes, self.augment = size, num_classes, augment

    @classmethod
    def generate(cls, root: str | os.PathLike, n: int, size: int = 64, seed: int = 0, *, num_classes: int = 10,
                 fmt: str = "jpeg") -> list[Path]:
        """Write the `n` images into `root` once (files already there are kept) and return their paths."""
        _positive_int(n=n, size=size, num_classes=num_classes)
        if fmt.lower() not in _FORMATS:
            raise ValueError(f"fmt={fmt!r} is not supported; allowed: jpeg, png")
        pil_format, ext = _FORMATS[fmt.lower()]
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        paths = []
        for i in range(n):
            label = i % num_classes
            # Every parameter that changes the pixels is in the name: a different setting never reuses a file.
            path = root / f"s{seed}_{size}px_{i:06d}_c{label}.{ext}"
            if not path.exists():
                buf = io.BytesIO()
                _make_image(i, label, size, seed).save(buf, format=pil_format, quality=90)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(buf.getvalue())
                os.replace(tmp, path)  # atomic: a crash leaves no half-written image
            paths.append(path)
        return paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[i]) as f:
            img = f.convert("RGB")  # forces the decode
        if self.augment:
            img = self._augment(img)
        elif img.size != (self.size, self.size):
            img = img.resize((self.size, self.size), Image.Resampling.BILINEAR)
        x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(self.size, self.size, 3)
        x = x.permute(2, 0, 1).float().div_(255)
        mean, std = torch.tensor(_MEAN).view(3, 1, 1), torch.tensor(_STD).view(3, 1, 1)
        return (x - mean) / std, self.labels[i]

    def _augment(self, img: Image.Image) -> Image.Image:
        # Global `random`: DataLoader reseeds it in each worker, so workers do not repeat each other.
        w, h = img.size
        area = w * h * random.uniform(0.35, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = min(w, round(math.sqrt(area * ratio))), min(h, round(math.sqrt(area / ratio)))
        x0, y0 = random.randint(0, w - cw), random.randint(0, h - ch)
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
            img = enhance(img).enhance(random.uniform(0.6, 1.4))
        return img
