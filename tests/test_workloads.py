import math
import pickle

import pytest
import torch

from gpulab.workloads.models import GPT, MLP, GPTConfig, SmallCNN, SyntheticImageDataset, gelu_tanh, random_matmul_inputs
from gpulab.workloads.text_data import ByteTokenizer, TokenDataset, build_text_corpus, get_batch, pad_vocab_size


def test_gpt_forward_shapes_and_initial_loss_is_ln_vocab():
    torch.manual_seed(0)
    cfg = GPTConfig.smoke()
    model = GPT(cfg)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 3, cfg.block_size))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, cfg.block_size, cfg.vocab_size)
    assert loss.item() == pytest.approx(math.log(cfg.vocab_size), rel=0.05)
    logits, loss = model(idx[:, :10])
    assert logits.shape == (3, 10, cfg.vocab_size) and loss is None
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, cfg.block_size + 1, dtype=torch.long))


def test_sdpa_and_manual_attention_agree_with_the_same_weights():
    torch.manual_seed(0)
    model = GPT(GPTConfig.smoke(n_head=4), attn="sdpa").eval()
    manual = GPT(GPTConfig.smoke(n_head=4), attn="manual").eval()
    manual.load_state_dict(model.state_dict())
    idx = torch.randint(0, 512, (2, 64))
    a, b = model(idx)[0], manual(idx)[0]
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    model.attn = "manual"  # switchable on a built model
    assert torch.allclose(model(idx)[0], b, atol=1e-6)
    with pytest.raises(ValueError, match="attn"):
        model.attn = "flash"


def test_num_params_and_weight_tying():
    model = GPT(GPTConfig.smoke())
    assert model.lm_head.weight is model.wte.weight
    assert model.num_params(non_embedding=False) - model.num_params() == 64 * 64
    assert GPTConfig.gpt2_small() == GPTConfig()


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_layer=0), "n_layer"), (dict(n_head=-1), "n_head"), (dict(vocab_size=0), "vocab_size"),
    (dict(n_embd=0), "n_embd"), (dict(block_size=0), "block_size"), (dict(n_embd=100, n_head=3), "n_embd"),
    (dict(dropout=1.5), "dropout")])
def test_bad_config_raises_value_error_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GPTConfig.smoke(**kwargs)


def test_mlp_and_cnn_shapes():
    assert MLP(8, 32, 3, depth=3)(torch.randn(5, 8)).shape == (5, 3)
    cnn = SmallCNN(num_classes=7, width=8)
    assert cnn(torch.randn(2, 3, 64, 64)).shape == (2, 7)
    assert cnn(torch.randn(2, 3, 40, 56)).shape == (2, 7)
    with pytest.raises(ValueError, match="depth"):
        MLP(8, 32, 3, depth=0)


def test_random_matmul_inputs():
    a, b = random_matmul_inputs(16, 8, 32, torch.bfloat16)
    assert a.shape == (16, 32) and b.shape == (32, 8) and a.dtype == b.dtype == torch.bfloat16
    assert (a != 0).float().mean() > 0.9 and (b != 0).float().mean() > 0.9
    a2, _ = random_matmul_inputs(16, 8, 32, "bf16")
    assert torch.equal(a, a2)  # seeded
    with pytest.raises(ValueError, match=r"dtype=.*allowed: fp32, fp16, bf16"):
        random_matmul_inputs(4, 4, 4, torch.int8)
    with pytest.raises(ValueError, match="k=0"):
        random_matmul_inputs(4, 4, 0)


def test_gelu_tanh_matches_torch():
    x = torch.randn(1000)
    assert torch.allclose(gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-6)


def test_image_dataset_is_deterministic_idempotent_and_decodes(tmp_path):
    ds = SyntheticImageDataset(tmp_path / "a", n_images=12, size=32, num_classes=4)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(files) == 12 and not any(f.endswith(".tmp") for f in files)
    mtimes = [(tmp_path / "a" / f).stat().st_mtime_ns for f in files]
    SyntheticImageDataset(tmp_path / "a", n_images=12, size=32, num_classes=4)  # second time: nothing rewritten
    assert [(tmp_path / "a" / f).stat().st_mtime_ns for f in files] == mtimes
    other = SyntheticImageDataset(tmp_path / "b", n_images=12, size=32, num_classes=4)
    assert [open(p, "rb").read() for p in ds.paths] == [open(p, "rb").read() for p in other.paths]
    assert ds.labels == [i % 4 for i in range(12)]
    x, y = ds[5]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == 1
    assert x.std() > 0.1  # not a blank image
    png = SyntheticImageDataset(tmp_path / "c", n_images=3, size=16, fmt="png", augment=False)
    assert png[0][0].shape == (3, 16, 16)
    with pytest.raises(ValueError, match="fmt"):
        SyntheticImageDataset(tmp_path / "d", n_images=2, fmt="gif")


def test_datasets_pickle(tmp_path):
    ds = SyntheticImageDataset(tmp_path, n_images=4, size=16)
    ds2 = pickle.loads(pickle.dumps(ds))
    assert ds2.paths == ds.paths and ds2[1][0].shape == (3, 16, 16)
    tds = TokenDataset(torch.arange(1000), 16)
    assert torch.equal(pickle.loads(pickle.dumps(tds))[3][0], tds[3][0])


def test_text_corpus_tokenizer_and_batches():
    text = build_text_corpus(max_bytes=50_000)
    assert 49_000 < len(text.encode()) <= 50_000 and text == build_text_corpus(max_bytes=50_000)
    tok = ByteTokenizer(pad_vocab_size(256 + 1))
    assert tok.vocab_size == 320
    ids = tok.encode(text)
    assert ids.dtype == torch.long and int(ids.max()) < 256 and tok.decode(ids[:500]) == text.encode()[:500].decode()
    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer(100)
    ds = TokenDataset(ids, block_size=32)
    x, y = ds[7]
    assert x.shape == y.shape == (32,) and torch.equal(x[1:], y[:-1]) and torch.equal(ds[7][0], x)
    assert not torch.equal(ds[0][0], ds[1][0])
    g = torch.Generator().manual_seed(0)
    xb, yb = get_batch(ids, 4, 32, generator=g)
    assert xb.shape == yb.shape == (4, 32) and xb.dtype == torch.long and torch.equal(xb[:, 1:], yb[:, :-1])
    with pytest.raises(ValueError, match="block_size"):
        TokenDataset(ids[:10], block_size=32)
