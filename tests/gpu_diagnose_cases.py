"""gl.diagnose on the course's planted "before" loops, 08's before and after, a ResNet-50 and a GPT-2 small.

    python tests/gpu_diagnose_cases.py --out DIR          # on one GPU: about 6 minutes, one JSON per case
    python tests/gpu_diagnose_cases.py --out DIR --smoke  # tiny sizes on a CPU, to check the script itself

Every model is plain PyTorch, written as a user would (no timm or transformers needed). Each case has a time
budget (gl.diagnose's `budget_s`); progress is printed as it goes, and DIR gets `<case>.json` and `summary.md`:
case, what was planted, the first finding, its share, its measured gain [interval], and the seconds it took.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import gpulab as gl  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = dict(device_type=DEV.type, dtype=torch.bfloat16)


def mlp(width: int, depth: int, classes: int = 10) -> nn.Module:
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(width, classes))


class Autocast(nn.Module):
    """A model whose forward runs under BF16 autocast (so its matmuls are not the planted problem)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        with torch.autocast(**BF16):
            return self.inner(x).float()


class Checked(nn.Module):
    """An MLP that checks every activation for NaNs with a Python `if`: one sync per layer and step."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        with torch.autocast(**BF16):
            for layer in self.layers:
                x = F.gelu(layer(x))
                if not torch.isfinite(x).all():  # .all() -> bool: the host waits for the GPU
                    raise FloatingPointError("NaN in an activation")
            return self.head(x).float()


class SlowDecode(torch.utils.data.Dataset):
    """Images decoded on the CPU at about 1 ms each (a JPEG decode and augmentation, in spirit)."""

    def __init__(self, n: int, size: int, decode_s: float):
        self.n, self.size, self.decode_s = n, size, decode_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(i)
        x = torch.randn(3, self.size, self.size, generator=g)
        while time.perf_counter() - t0 < self.decode_s:
            x = x * 0.999 + 0.001
        return x, i % 10


class CausalSelfAttention(nn.Module):
    """nanoGPT's manual attention, or SDPA (`sdpa=True`), as GPT-2 implementations write it."""

    def __init__(self, d: int, heads: int, sdpa: bool):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.c_attn(x).split(d, 2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sdpa: bool):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, sdpa)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2LMHeadModel(nn.Module):
    """Hugging Face's GPT2LMHeadModel in shape and interface: forward(input_ids) -> output with .logits."""

    def __init__(self, vocab=50257, d=768, layers=12, heads=12, ctx=1024, sdpa=True, bf16=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads, sdpa) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.bf16 = bf16

    def forward(self, input_ids):
        # autocast(enabled=False) would switch off a caller's autocast too: only a BF16 model enters one
        with torch.autocast(**BF16) if self.bf16 else contextlib.nullcontext():
            t = input_ids.shape[1]
            x = self.wte(input_ids) + self.wpe(torch.arange(t, device=input_ids.device))
            for block in self.h:
                x = block(x)
            return type("Output", (dict,), {"__getattr__": dict.__getitem__})(logits=self.lm_head(self.ln_f(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


def resnet(layers=(3, 4, 6, 3), widths=(64, 128, 256, 512), classes=1000) -> nn.Module:
    """ResNet-50 as timm builds it (layers 3-4-6-3, bottlenecks); smaller `layers`/`widths` for smoke runs."""
    stem = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    blocks, cin = [], widths[0]
    for i, (n, w) in enumerate(zip(layers, widths)):
        for j in range(n):
            blocks.append(Bottleneck(cin, w, 2 if j == 0 and i > 0 else 1))
            cin = w * 4
    return nn.Sequential(*stem, *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def images(size, classes=10):
    return lambda b: (torch.randn(b, 3, size, size, device=DEV), torch.randint(classes, (b,), device=DEV))


def vectors(width):
    return lambda b: (torch.randn(b, width, device=DEV), torch.randint(10, (b,), device=DEV))


def tokens(vocab, t):
    return lambda b: (torch.randint(vocab, (b, t), device=DEV), torch.randint(vocab, (b, t), device=DEV))


def lm_loss(out, y):
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def logged(loss_fn, log):
    def fn(out, y):
        loss = loss_fn(out, y)
        log.append(loss.item())  # logging every step: one more sync
        return loss
    return fn


def cases(s: bool) -> list[dict]:
    """Each case: name, what was planted (or "" for a well-tuned loop), and what gl.diagnose gets."""
    W = 64 if s else 4096
    fused = {"fused": True} if DEV.type == "cuda" else {}

    def opt(model, **kw):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, **({**fused, **kw}))
    out = []
    m = mlp(W, 4).to(DEV)
    out.append(dict(name="fp32_matmul_mlp", planted="fp32_matmul", model=m, make_batch=vectors(W),
                    loss_fn=F.cross_entropy, batch_size=16 if s else 1024, optimizer=opt(m)))
    # matmuls big enough that the host would run ahead of the GPU, were it not stopped at every check
    m = Checked(64 if s else 4096, 4 if s else 8).to(DEV)
    out.append(dict(name="item_per_step", planted="sync", model=m, make_batch=vectors(64 if s else 4096),
                    loss_fn=logged(F.cross_entropy, []), batch_size=16 if s else 8192, optimizer=opt(m)))
    m = Autocast(nn.Sequential(nn.Flatten(), mlp(3 * 32 * 32, 2))).to(DEV)
    loader = torch.utils.data.DataLoader(SlowDecode(512, 32, 0.0005 if s else 0.001), batch_size=16 if s else 128)
    out.append(dict(name="starving_loader", planted="data_wait", model=m, make_batch=images(32),
                    loss_fn=F.cross_entropy, batch_size=16 if s else 128, optimizer=opt(m), loader=loader))
    m = Autocast(mlp(64 if s else 1024, 4)).to(DEV)
    out.append(dict(name="batch_8", planted="small_batch", model=m, make_batch=vectors(64 if s else 1024),
                    loss_fn=F.cross_entropy, batch_size=8, optimizer=opt(m)))
    m = GPT2LMHeadModel(512, 64, 1, 2, 64, sdpa=False, bf16=True) if s else \
        GPT2LMHeadModel(8192, 768, 4, 12, 1024, sdpa=False, bf16=True)
    m = m.to(DEV)
    out.append(dict(name="manual_attention", planted="attention", model=m,
                    make_batch=tokens(512 if s else 8192, 64 if s else 1024), loss_fn=lm_loss,
                    batch_size=4 if s else 16, optimizer=opt(m)))
    m = Autocast(mlp(64 if s else 256, 8 if s else 48)).to(DEV)
    out.append(dict(name="foreachless_adamw", planted="optimizer", model=m, make_batch=vectors(64 if s else 256),
                    loss_fn=F.cross_entropy, batch_size=16 if s else 1024,
                    optimizer=torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)))
    # a ResNet-style net on ImageNet-sized images: convolutions, not launches, fill its step
    m = Autocast(resnet((1, 1), (8, 16), 10) if s else resnet((2, 2, 2), (64, 128, 256), 10)).to(DEV)
    out.append(dict(name="nchw_convnet", planted="layout", model=m, make_batch=images(32 if s else 224),
                    loss_fn=F.cross_entropy, batch_size=8 if s else 128, optimizer=opt(m)))
    out += case_study(s)
    m = (resnet((1, 1), (8, 16), 10) if s else resnet()).to(DEV)
    out.append(dict(name="resnet50_batch32", planted="launch_bound/small_batch/layout", model=m,
                    make_batch=images(32 if s else 224, 10 if s else 1000), loss_fn=F.cross_entropy,
                    batch_size=4 if s else 32, optimizer=torch.optim.AdamW(m.parameters(), lr=1e-4),
                    budget_s=12 if s else 170))  # room for batch x2, channels_last and a torch.compile
    m = (GPT2LMHeadModel(512, 64, 1, 2, 64) if s else GPT2LMHeadModel()).to(DEV)
    out.append(dict(name="hf_gpt2_small", planted="fp32_matmul (FP32, as from_pretrained gives it)", model=m,
                    make_batch=tokens(512 if s else 50257, 64 if s else 1024), loss_fn=lm_loss,
                    batch_size=2 if s else 8, optimizer=torch.optim.AdamW(m.parameters(), lr=1e-4),
                    budget_s=12 if s else 40))
    return out


def case_study(s: bool) -> list[dict]:
    """Notebook 08's naive loop and its optimized one (without torch.compile: its compile would take the budget)."""
    from gpulab.workloads.training import Trainer, TrainConfig, waterfall_configs
    from gpulab.workloads.models import GPTConfig

    model = GPTConfig.smoke() if s else GPTConfig.gpt2_small(vocab_size=50257)
    naive = TrainConfig(model=model, batch_size=2 if s else 8, warmup_steps=0)
    fast = waterfall_configs(naive, batch_size=4 if s else 16, grad_accum=1, num_workers=0 if s else 4,
                             compile=False)[-1][1]
    data = torch.randint(model.vocab_size, (200_000,), generator=torch.Generator().manual_seed(0))
    out = []
    for name, cfg, planted in (("08_before", naive, "fp32_matmul/attention/sync"), ("08_after", fast, "")):
        trainer = Trainer(cfg, data, DEV)
        out.append(dict(name=name, planted=planted, step=trainer.step, close=trainer.close))
    return out


def run_case(c: dict, budget: float, out: Path) -> dict:
    """Diagnose case `c` in `budget` seconds (a case with its own budget gets it scaled by budget / 25 on a GPU)."""
    if "budget_s" in c and DEV.type == "cuda":
        c = {**c, "budget_s": c["budget_s"] * budget / 25.0}
    print(f"[{time.strftime('%H:%M:%S')}] {c['name']} (planted: {c['planted'] or 'nothing'})", flush=True)
    t0 = time.perf_counter()
    try:
        if "step" in c:
            d = gl.diagnose(c["step"], budget_s=c.get("budget_s", budget), progress=False)
        else:
            kw = {k: c[k] for k in ("batch_size", "optimizer", "loader") if k in c}
            d = gl.diagnose(c["model"], c["make_batch"], c["loss_fn"], budget_s=c.get("budget_s", budget),
                            progress=False, **kw)
        rec = {"case": c["name"], "planted": c["planted"], "diagnosis": d.to_dict(), "text": str(d)}
        top = d.findings[0]
        row = dict(case=c["name"], planted=c["planted"], first=top.kind, share=top.share, gain=top.gain_text(),
                   why=top.why, kinds=d.kinds(), seconds=time.perf_counter() - t0)
    except Exception as e:  # one case's failure must not hide the others
        rec = {"case": c["name"], "error": f"{type(e).__name__}: {e}"}
        row = dict(case=c["name"], planted=c["planted"], first="ERROR", share=0.0, gain=str(e)[:80], why="",
                   kinds=[], seconds=time.perf_counter() - t0)
    finally:
        if "close" in c:
            c["close"]()
    (out / f"{c['name']}.json").write_text(json.dumps(rec, indent=1, default=str))
    print(f"    -> {row['first']} {row['share']:.0%}, gain {row['gain']}, {row['seconds']:.0f} s; all: {row['kinds']}",
          flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for one JSON per case and summary.md")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check of the script)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per case (default: 25, 8 with --smoke; on a GPU the ResNet-50 and GPT-2 cases get 170 and 40 times this over 25)")
    ap.add_argument("--only", default="", help="comma-separated case names to run")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = a.budget or (8.0 if a.smoke else 25.0)
    print(f"device: {gl.get_device().name}; budget {budget:.0f} s per case", flush=True)
    t0 = time.perf_counter()
    rows = []
    for c in cases(a.smoke):
        if a.only and c["name"] not in a.only.split(","):
            if "close" in c:
                c["close"]()
            continue
        rows.append(run_case(c, budget, out))
    lines = [f"# gl.diagnose cases on {gl.get_device().name} ({time.perf_counter() - t0:.0f} s in all)", "",
             "| case | planted | first finding | share | measured gain [interval] | diagnose took |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['planted'] or '(well tuned)'} | {r['first']} | {r['share']:.0%} | {r['gain']}"
              + (f" ({r['why']})" if r['why'] else "") + f" | {r['seconds']:.0f} s |" for r in rows]
    tmp = out / "summary.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out / "summary.md")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
