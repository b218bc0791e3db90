"""Text for the GPT runs: a corpus from files on this machine, a byte tokenizer, token datasets and batches."""
from __future__ import annotations

import fnmatch
import os
import sysconfig
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import Dataset

from .models import _positive_int


def _walk_sorted(root: Path, pattern: str) -> Iterator[Path]:
    """Files matching `pattern` under `root` in a fixed order, lazily; installed packages are skipped."""
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        # Installed packages differ between machines; the stdlib does not.
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        yield from (Path(dirpath, f) for f in sorted(filenames) if fnmatch.fnmatch(f, pattern))


def build_text_corpus(max_bytes: int = 4_000_000, roots: list[str | os.PathLike] | None = None,
                      pattern: str = "*.py") -> str:
    """Concatenate text files already on the machine (default: Python's stdlib sources), sorted, up to max_bytes.

    The same Python version gives the same text on every machine; files that are not UTF-8 are skipped.
    """
    _positive_int(max_bytes=max_bytes)
    roots = [Path(r) for r in (roots or [sysconfig.get_paths()["stdlib"]])]
    for root in roots:
        if not root.exists():
            raise ValueError(f"roots: {str(root)!r} does not exist")
    chunks, total = [], 0
    for f in (f for root in roots for f in _walk_sorted(root, pattern)):
        try:
            data = f.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        chunks.append(data)
        total += len(data) + 2
        if total >= max_bytes:
            break
    if not chunks:
        raise ValueError(f"no readable {pattern} files under roots={[str(r) for r in roots]}")
    # Cutting may split a multi-byte character: drop the partial one.
    return b"\n\n".join(chunks)[:max_bytes].decode("utf-8", errors="ignore")


def pad_vocab_size(vocab_size: int, multiple: int = 64) -> int:
    """Round a vocabulary size up to a multiple (50257 -> 50304): matmul shapes tensor cores like."""
    _positive_int(vocab_size=vocab_size, multiple=multiple)
    return -(-vocab_size // multiple) * multiple


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0..255); `vocab_size` may be padded above 256, the extra ids are never used."""

    def __init__(self, vocab_size: int = 256):
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"vocab_size={vocab_size!r} must be an integer >= 256")
        self.vocab_size = vocab_size

    def encode(self, text: str, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """Token ids of `text` as a 1-D tensor."""
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(dtype)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Text of token ids; ids >= 256 (padding) are dropped, broken UTF-8 is replaced."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"


def _check_tokens(tokens: torch.Tensor, block_size: int) -> None:
    _positive_int(block_size=block_size)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
        raise ValueError("tokens must be a 1-D tensor of token ids")
    if tokens.numel() <= block_size + 1:
        raise ValueError(f"tokens has {tokens.numel()} ids; needs more than block_size + 1 = {block_size + 1}")


class TokenDataset(Dataset):
    """Windows of `block_size` tokens and the same window shifted by one (the targets), at seeded offsets."""

    def __init__(self, tokens: torch.Tensor, block_size: int, num_samples: int | None = None, seed: int = 0):
        _check_tokens(tokens, block_size)
        self.tokens, self.block_size, self.seed = tokens, block_size, seed
        self.num_samples = num_samples if num_samples is not None else tokens.numel() // block_size
        _positive_int(num_samples=self.num_samples)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        # splitmix64 of (seed, i): a random-looking offset that is the same in every process and every run.
        z = (self.seed * 0x9E3779B97F4A7C15 + i + 1) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        off = (z ^ (z >> 31)) % (self.tokens.numel() - self.block_size - 1)
        chunk = self.tokens[off:off + self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


def get_batch(tokens: torch.Tensor, batch_size: int, block_size: int, device: torch.device | str | None = None,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch (x, y) of shape (batch_size, block_size) on `device`, nanoGPT-style, without a DataLoader."""
    _check_tokens(tokens, block_size)
    _positive_int(batch_size=batch_size)
    ix = torch.randint(tokens.numel() - block_size - 1, (batch_size,), generator=generator).tolist()
    x = torch.stack([tokens[i:i + block_size] for i in ix]).long()
    y = torch.stack([tokens[i + 1:i + 1 + block_size] for i in ix]).long()
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        # Pinned host memory lets the copy run asynchronously to the GPU's queue.
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
