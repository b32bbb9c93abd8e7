# SPDX-License-Identifier: Apache-2.0
"""attnmix.torch's streaming modules (ctest labels python;torch): SlidingWindowSpine, MomentClosureAttention and
train_tbptt as torch.nn.Modules over the C++ mechanisms.

Oracles: the C++ paths themselves (`attnmix lm train` checkpoints scored by `attnmix lm eval` and
attnmix.experimental.evaluate_language_model, and training by train_language_model), one pass vs chunks (acceptance task
E1-4), each stream alone vs the batch (MCA-10), torch.autograd.gradcheck (float64 central differences), and round trips
(state_dict, torch.save, copy.deepcopy). Every bad argument raises TypeError or ValueError naming it."""
import copy
import dataclasses
import io
import math
import os
import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnmix.experimental as ex
from attnmix.torch import (
    ClusterBank,
    ContextMechanism,
    MomentClosureAttention,
    MomentClosureState,
    SlidingWindowSpine,
    SlidingWindowState,
    empty_cluster_bank,
    train_tbptt,
)

CLI = os.environ.get("ATTNMIX_CLI")
STREAM_RTOL = 1e-5  # task E1-4: chunks vs one pass, float32 (RoPE tables and softmax over different key sets)
LEAK_RTOL = 1e-10  # task MCA-10: a stream alone vs inside a batch, float64 (batched products may sum differently)
GRADCHECK = dict(eps=1e-6, atol=1e-5, rtol=1e-3)  # float64 central differences

REFERENCE_NAMES_ONE_LAYER = [
    "tok.weight",
    "qkv.0.weight",
    "qkv.0.bias",
    "proj.0.weight",
    "proj.0.bias",
    "ln1.0.weight",
    "ln1.0.bias",
    "ln2.0.weight",
    "ln2.0.bias",
    "mlp.0.0.weight",
    "mlp.0.0.bias",
    "mlp.0.2.weight",
    "mlp.0.2.bias",
    "ln_f.weight",
    "ln_f.bias",
    "head.weight",
]


@pytest.fixture(autouse=True)
def one_thread():
    """Bitwise comparisons with the C++ paths need the same thread count (libtorch's reductions may depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- helpers ------------------------------------------------------------------------------------------------


def ids(gen, shape, vocab):
    return torch.randint(0, vocab, shape, generator=gen)


def chunks_of(tokens, sizes):
    """(x, y) chunks of a (b, n) token tensor with the given lengths: y is x shifted by one."""
    out, offset = [], 0
    for t in sizes:
        out.append((tokens[:, offset : offset + t], tokens[:, offset + 1 : offset + 1 + t]))
        offset += t
    return out


def corpus_text():
    """About 3 KB of deterministic word salad (bytes), a corpus for the CLI."""
    words = "the of stream window cluster token key value far near field attention model loss chunk".split()
    rng = np.random.default_rng(0)
    text = " ".join(words[i] for i in rng.integers(0, len(words), 600))
    return (text + ".\n").encode()


def small_mca(**kw):
    args = dict(d_model=16, n_layer=2, n_head=2, window=4, max_clusters=3)
    args.update(kw)
    return MomentClosureAttention(16, **args)


def carried_tensors(state):
    if isinstance(state, MomentClosureState):
        out = carried_tensors(state.near)
        for bank in state.banks:
            out += [bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk]
        return out
    return [t for t in state.cache_k + state.cache_v if t is not None]


def relative_error(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def tied_outliers_in_index_order(receipt, rtol):
    """A stream receipt whose per-cluster outlier lists order tied residuals (equal within rtol, such as a token
    repeated in one chunk) by token index: which of two tied tokens ranks first depends on the last bit."""
    out = copy.deepcopy(receipt)
    for outliers in out.get("per_cluster_outlier_tokens", {}).values():
        residuals, order, start = outliers["residuals"], [], 0
        for end in range(1, len(residuals) + 1):
            if end == len(residuals) or residuals[end] != pytest.approx(residuals[start], rel=rtol, abs=rtol):
                order += sorted(range(start, end), key=lambda i: outliers["indices"][i])
                start = end
        outliers["indices"] = [outliers["indices"][i] for i in order]
        outliers["residuals"] = [residuals[i] for i in order]
        for key in ("k", "v"):
            if key in outliers:
                outliers[key] = outliers[key][order]
    return out


def assert_receipts_close(a, b, rtol, path="receipt"):
    """Receipt dicts equal: ints, bools and structure exactly, floats and tensors to rtol."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for key in a:
            assert_receipts_close(a[key], b[key], rtol, f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_receipts_close(x, y, rtol, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * max(float(b.abs().max()), 1.0), msg=path)
    elif isinstance(a, float):
        assert isinstance(b, float) and a == pytest.approx(b, rel=rtol, abs=rtol), path
    else:
        assert a == b and type(a) is type(b), path


# ---- the C++ paths at the same weights ------------------------------------------------------------------------


def train_checkpoint(tmp_path, mechanism):
    """A tiny `attnmix lm train` run (through the CLI when it is built); returns (checkpoint, text path)."""
    text = tmp_path / "corpus.txt"
    text.write_bytes(corpus_text())
    ckpt = tmp_path / "model.ckpt"
    flags = dict(mechanism=mechanism, d_model=16, n_layer=2, n_head=2, window=8, batch=2, chunk=8, steps=6, seed=3)
    if mechanism == "moment-closure":
        flags["max_clusters"] = 3
    if CLI:
        args = [CLI, "lm", "train", "--text", str(text), "--holdout", "0.2", "--out", str(ckpt), "--threads", "1"]
        for key, value in flags.items():
            args += ["--" + key.replace("_", "-"), str(value)]
        subprocess.run(args, check=True, capture_output=True)
    else:
        tokens = np.frombuffer(text.read_bytes(), dtype=np.uint8).astype(np.int64)
        held = math.ceil(0.2 * len(tokens))
        ex.train_language_model(tokens[:-held], out=str(ckpt), threads=1, **flags)
    return ckpt, text


def python_evaluate(mech, tokens, chunk):
    """What stream::evaluate computes, driven from Python: one stream, chunk by chunk, summed cross-entropy."""
    data = torch.as_tensor(tokens).reshape(1, -1)
    n = data.shape[1]
    state = mech.init_state(1)
    total = 0.0
    with torch.no_grad():
        for offset in range(0, n - 1, chunk):
            t = min(chunk, n - 1 - offset)
            state, logits = mech.advance(state, data[:, offset : offset + t])
            targets = data[0, offset + 1 : offset + 1 + t]
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="sum").item()
    return total / (n - 1)


@pytest.mark.parametrize("mechanism", ["window", "full", "moment-closure"])
def test_forward_equals_the_cpp_path_bitwise(tmp_path, mechanism):
    """A checkpoint of `attnmix lm train`, loaded with from_checkpoint and streamed from Python, scores its held-out
    text exactly as evaluate_language_model does (same float32 operations, one thread), and as `attnmix lm eval`
    prints it (6 significant digits)."""
    ckpt, text = train_checkpoint(tmp_path, mechanism)
    cls = MomentClosureAttention if mechanism == "moment-closure" else SlidingWindowSpine
    mech = cls.from_checkpoint(ckpt)
    assert mech.d_model == 16 and mech.n_layer == 2
    assert mech.window == (None if mechanism == "full" else 8)
    tokens = np.frombuffer(text.read_bytes(), dtype=np.uint8).astype(np.int64)
    held = tokens[-math.ceil(0.2 * len(tokens)) :]
    ours = python_evaluate(mech, held, 8)
    theirs = ex.evaluate_language_model(str(ckpt), held, chunk=8, threads=1)["mean_cross_entropy"]
    assert ours == theirs
    # A model that does not have the checkpoint's weights scores differently (the comparison can fail).
    torch.manual_seed(123)
    fresh = copy.deepcopy(mech)
    with torch.no_grad():
        fresh.tok.weight.add_(0.01 * torch.randn(fresh.tok.weight.shape))
    assert python_evaluate(fresh, held, 8) != theirs
    if CLI:
        out = subprocess.run(
            [CLI, "lm", "eval", "--checkpoint", str(ckpt), "--text", str(text), "--holdout", "0.2", "--chunk", "8",
             "--threads", "1"],
            check=True, capture_output=True, text=True,
        ).stdout
        printed = float(re.search(r"cross-entropy\s+([0-9.eE+-]+) nats", out).group(1))
        assert printed == pytest.approx(ours, rel=1e-5)


def test_from_checkpoint_refuses_the_other_mechanism_and_bad_files(tmp_path):
    ckpt, _ = train_checkpoint(tmp_path, "window")
    with pytest.raises(ValueError, match="MomentClosureAttention|SlidingWindowSpine"):
        MomentClosureAttention.from_checkpoint(ckpt)
    with pytest.raises(OSError, match="nothing.ckpt"):
        SlidingWindowSpine.from_checkpoint(tmp_path / "nothing.ckpt")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="garbage.ckpt"):
        MomentClosureAttention.from_checkpoint(tmp_path / "garbage.ckpt")
    with pytest.raises(TypeError, match="path"):
        SlidingWindowSpine.from_checkpoint(3)
    wider = SlidingWindowSpine(256, d_model=32, n_layer=2, n_head=2, window=8)
    before = [p.detach().clone() for p in wider.parameters()]
    with pytest.raises(RuntimeError, match=r"model.ckpt.*backbone.tok.weight has shape \[256, 16\]"):
        wider._native.load_checkpoint(str(ckpt))  # the loader itself checks every shape, and copies nothing
    assert all(torch.equal(a, b) for a, b in zip(before, wider.parameters()))
    # from_checkpoint does not consume the caller's random stream.
    torch.manual_seed(9)
    expected = torch.rand(3)
    torch.manual_seed(9)
    SlidingWindowSpine.from_checkpoint(ckpt)
    assert torch.equal(torch.rand(3), expected)


# The tolerance of Python-driven AdamW training against `lm train`: 0. In torch 1.13 Python's AdamW (the default
# single-tensor path, foreach off on the CPU) performs libtorch's C++ AdamW's float32 operations in the same order
# (decay, moments, bias corrections in double, addcdiv), clip_grad_norm_ is the same computation when it receives the
# parameters in the C++ module's order (the norm of the stacked per-parameter norms), and the forward and backward
# are the same C++ code. A torch version whose Python AdamW orders its arithmetic differently would need a relative
# tolerance of about 1e-5 per step instead (float32 rounding, compounding over 20 steps).
ADAMW_RTOL = 0.0


@pytest.mark.parametrize("mechanism", ["window", "moment-closure"])
def test_adamw_training_from_python_equals_lm_train(mechanism):
    """20 steps of Python-driven train_tbptt with torch.optim.AdamW, gradient clipping and a constant learning rate,
    on lm train's data layout (2 streams, passes of 10 chunks with a state reset at each, detach horizon 2), equal
    train_language_model's losses from the same seed: torch.manual_seed before construction gives the C++ trainer's
    initial weights."""
    vocab, batch, chunk, seed, lr, wd, clip = 32, 2, 8, 5, 3e-3, 0.01, 1.0
    sizes = dict(d_model=16, n_layer=2, n_head=2, window=8)
    if mechanism == "moment-closure":
        sizes["max_clusters"] = 3
    tokens = np.random.default_rng(11).integers(0, vocab, size=170)  # streams of 85: passes of (85 - 1) // 8 = 10
    summary = ex.train_language_model(
        tokens, mechanism=mechanism, vocab=vocab, batch=batch, chunk=chunk, steps=20, detach_horizon=2, lr=lr,
        schedule="constant", weight_decay=wd, clip=clip, seed=seed, threads=1, **sizes,
    )
    torch.manual_seed(seed)
    cls = MomentClosureAttention if mechanism == "moment-closure" else SlidingWindowSpine
    mech = cls(vocab, **sizes)
    opt = torch.optim.AdamW(mech.parameters(), lr=lr, weight_decay=wd)
    in_cpp_order = [p for _, p in mech._native.named_parameters()]
    data = torch.from_numpy(tokens).reshape(batch, -1)
    losses = []
    for _ in range(2):  # two passes; each starts from an empty state
        passes = [(data[:, o : o + chunk], data[:, o + 1 : o + 1 + chunk]) for o in range(0, 80, chunk)]
        result = train_tbptt(
            mech, mech.init_state(batch), passes, opt, detach_horizon=2,
            before_update=lambda k: torch.nn.utils.clip_grad_norm_(in_cpp_order, clip),
        )
        losses += result["losses"]
    expected = summary["losses"]
    assert len(losses) == len(expected) == 20
    assert losses[0] == expected[0]  # same initial weights, same forward
    np.testing.assert_allclose(losses, expected, rtol=ADAMW_RTOL, atol=0)
    assert losses[-1] < losses[0]


# ---- streaming and streams ------------------------------------------------------------------------------------


def test_streaming_equals_a_single_pass():
    """acceptance task E1-4 from Python: with window=None (or a window covering the stream) chunks give one pass's
    logits and loss (float32, rel 1e-5). A short window does too here, since its cache holds exactly the keys the window
    can see; restarting the state at every chunk does not (the comparison can fail)."""
    gen = torch.Generator().manual_seed(4)
    tokens = ids(gen, (2, 25), 20)
    x, y = tokens[:, :-1], tokens[:, 1:]
    for window, carry in ((None, True), (64, True), (4, True), (None, False)):
        torch.manual_seed(1)
        mech = SlidingWindowSpine(20, d_model=16, n_layer=2, n_head=2, window=window)
        _, whole = mech.advance(mech.init_state(2), x)
        _, whole_loss = mech.step(mech.init_state(2), (x, y))
        state, parts, loss_sum = mech.init_state(2), [], 0.0
        for cx, cy in chunks_of(tokens, [5, 8, 11]):
            if not carry:
                state = mech.init_state(2)
            _, logits = mech.advance(state, cx)
            state, loss = mech.step(state, (cx, cy))
            parts.append(logits)
            loss_sum += float(loss) * cx.shape[1]
        chunked = torch.cat(parts, 1)
        if carry:
            assert state.pos == 24
            assert relative_error(chunked, whole) <= STREAM_RTOL
            assert loss_sum / 24 == pytest.approx(float(whole_loss), rel=STREAM_RTOL)
        else:
            assert relative_error(chunked, whole) > 1e-3


@pytest.mark.parametrize("birth_threshold", [-2.0, 50.0])
def test_no_cross_stream_leakage(birth_threshold):
    """acceptance task MCA-10 from Python: a batch of 2 streams gives each stream the logits, loss, banks and receipts
    it gets alone (float64, rel 1e-10)."""
    torch.manual_seed(2)
    mech = small_mca(birth_threshold=birth_threshold).double()
    gen = torch.Generator().manual_seed(5)
    tokens = ids(gen, (2, 21), 16)
    sizes = [5, 5, 5, 5]

    def run(stream_tokens):
        state, logits, losses, receipts = mech.init_state(stream_tokens.shape[0]), [], [], []
        for cx, cy in chunks_of(stream_tokens, sizes):
            _, out = mech.advance(state, cx)
            state, loss = mech.step(state, (cx, cy))
            logits.append(out)
            losses.append(float(loss))
            receipts.append(copy.deepcopy(mech.last_receipts))
        return state, torch.cat(logits, 1), losses, receipts

    both = run(tokens)
    alone = [run(tokens[b : b + 1]) for b in range(2)]
    assert max(max(bank.n_clusters) for bank in both[0].banks) >= 1, "the far field is used"
    for b in range(2):
        state, logits, losses, receipts = alone[b]
        assert relative_error(both[1][b], logits[0]) <= LEAK_RTOL
        for bank_both, bank_alone in zip(both[0].banks, state.banks):
            assert bank_both.n_clusters[b] == bank_alone.n_clusters[0]
            for field in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk"):
                a, e = getattr(bank_both, field)[b], getattr(bank_alone, field)[0]
                torch.testing.assert_close(a, e, rtol=LEAK_RTOL, atol=LEAK_RTOL * max(float(e.abs().max()), 1.0))
        for step_both, step_alone in zip(both[3], receipts):
            for layer_both, layer_alone in zip(step_both, step_alone):
                assert layer_both["batch_size"] == 2 and layer_alone["batch_size"] == 1
                assert_receipts_close(
                    tied_outliers_in_index_order(layer_both["streams"][b], LEAK_RTOL),
                    tied_outliers_in_index_order(layer_alone["streams"][0], LEAK_RTOL),
                    LEAK_RTOL,
                )
    for i in range(len(sizes)):
        mean = (alone[0][2][i] + alone[1][2][i]) / 2  # equal chunk lengths: the batch loss is the mean
        assert both[2][i] == pytest.approx(mean, rel=LEAK_RTOL)
    # The two streams differ, so a shared bank would have shown.
    assert not torch.equal(alone[0][0].banks[0].mu_k[0], alone[1][0].banks[0].mu_k[0])


# ---- protocol, detach, train_tbptt ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SlidingWindowSpine, MomentClosureAttention])
def test_protocol_detach_and_tbptt(cls):
    """acceptance tasks MCA-11 / E1-6: both are ContextMechanisms; train_tbptt over 4 chunks of 6 (vocab 12, d 16, one
    layer, 2 heads, window 4) gives finite losses and updates every detach_horizon chunks plus the flushed remainder;
    after detach no carried tensor requires grad and a second step's backward succeeds (without detach it fails)."""
    torch.manual_seed(3)
    mech = cls(12, d_model=16, n_layer=1, n_head=2, window=4)
    assert isinstance(mech, ContextMechanism)
    assert not isinstance(object(), ContextMechanism)
    gen = torch.Generator().manual_seed(6)
    tokens = ids(gen, (2, 25), 12)
    chunks = chunks_of(tokens, [6, 6, 6, 6])
    opt = torch.optim.AdamW(mech.parameters(), lr=1e-3)
    updates = []
    result = train_tbptt(mech, mech.init_state(2), chunks[:3], opt, detach_horizon=2, before_update=updates.append)
    assert updates == [0, 1]  # one full horizon and the flushed remainder
    assert len(result["losses"]) == 3 and all(math.isfinite(v) for v in result["losses"])
    state = result["state"]
    assert carried_tensors(state) and not any(t.requires_grad for t in carried_tensors(state))
    if cls is MomentClosureAttention:
        assert max(state.banks[0].n_clusters) >= 1
    state, loss = mech.step(state, chunks[3])
    assert any(t.requires_grad for t in carried_tensors(state))
    loss.backward()
    assert mech.tok.weight.grad is not None
    # Without detach the second backward reaches the freed graph of the first.
    s1, l1 = mech.step(mech.init_state(2), chunks[0])
    l1.backward()
    _, l2 = mech.step(s1, chunks[1])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        l2.backward()
    # detach of a fresh graph cuts it.
    s1, _ = mech.step(mech.init_state(2), chunks[0])
    assert not any(t.requires_grad for t in carried_tensors(mech.detach(s1)))


def test_detach_keeps_the_banks_when_asked():
    torch.manual_seed(3)
    mech = small_mca(n_layer=1)
    gen = torch.Generator().manual_seed(6)
    chunks = chunks_of(ids(gen, (1, 13), 16), [6, 6])
    state = mech.init_state(1)
    state, _ = mech.step(state, chunks[0])
    state, _ = mech.step(state, chunks[1])
    kept = mech.detach(dataclasses.replace(state, detach_horizon_clusters=False))
    assert kept.detach_horizon_clusters is False
    assert not any(t.requires_grad for t in carried_tensors(kept.near))
    assert kept.banks[0].mu_k.requires_grad


@pytest.mark.parametrize("horizon", [0, -1, 1.5, True, "2"])
def test_train_tbptt_rejects_a_bad_horizon(horizon):
    mech = small_mca()
    with pytest.raises(ValueError, match="detach_horizon"):
        train_tbptt(mech, mech.init_state(1), [], torch.optim.SGD(mech.parameters(), lr=0.1), detach_horizon=horizon)
    with pytest.raises(TypeError, match="mechanism"):
        train_tbptt(object(), None, [], torch.optim.SGD(mech.parameters(), lr=0.1))


# ---- parameters -----------------------------------------------------------------------------------------------


def test_parameters_are_the_tensors_the_cpp_forward_reads():
    """Reference names, one tied embedding, gradients where optimizers look, in-place dtype conversion."""
    torch.manual_seed(0)
    mech = small_mca(n_layer=1)
    assert list(mech.state_dict()) == REFERENCE_NAMES_ONE_LAYER
    assert mech.head.weight is mech.tok.weight
    assert len(list(mech.parameters())) == len(REFERENCE_NAMES_ONE_LAYER) - 1
    native = dict(mech._native.named_parameters())
    assert native["backbone.layer0.fc2.bias"] is mech.mlp[0][2].bias
    assert all(isinstance(p, torch.nn.Parameter) for p in native.values())
    gen = torch.Generator().manual_seed(1)
    chunk = chunks_of(ids(gen, (2, 9), 16), [8])[0]
    _, loss = mech.step(mech.init_state(2), chunk)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mech.parameters())
    with torch.no_grad():
        # in place: the C++ forward sees it (a shift that differs across features: LayerNorm removes a uniform one)
        mech.proj[0].bias += torch.linspace(0.0, 1.0, mech.proj[0].bias.numel())
    _, moved = mech.step(mech.init_state(2), chunk)
    assert float(moved) != float(loss)
    mech.double()
    assert native["backbone.tok.weight"].dtype == torch.float64 and mech.tok.weight is native["backbone.tok.weight"]
    state = mech.init_state(2)
    assert state.banks[0].count.dtype == torch.float64
    _, loss64 = mech.step(state, chunk)
    assert loss64.dtype == torch.float64
    assert float(loss64) == pytest.approx(float(moved), rel=1e-4)


def test_a_reference_style_state_dict_loads():
    """A state dict laid out as the reference design's modules lay it out loads into both mechanisms."""
    d, vocab, n_layer = 16, 16, 1
    ref = torch.nn.Module()
    ref.tok = torch.nn.Embedding(vocab, d)
    ref.qkv = torch.nn.ModuleList([torch.nn.Linear(d, 3 * d)])
    ref.proj = torch.nn.ModuleList([torch.nn.Linear(d, d)])
    ref.ln1 = torch.nn.ModuleList([torch.nn.LayerNorm(d)])
    ref.ln2 = torch.nn.ModuleList([torch.nn.LayerNorm(d)])
    ref.mlp = torch.nn.ModuleList(
        [torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))]
    )
    ref.ln_f = torch.nn.LayerNorm(d)
    ref.head = torch.nn.Linear(d, vocab, bias=False)
    ref.head.weight = ref.tok.weight
    for cls in (SlidingWindowSpine, MomentClosureAttention):
        mech = cls(vocab, d_model=d, n_layer=n_layer, n_head=2, window=4)
        mech.load_state_dict(ref.state_dict())
        for name, value in ref.state_dict().items():
            assert torch.equal(mech.state_dict()[name], value), name


def test_state_dict_round_trip():
    torch.manual_seed(1)
    a = small_mca()
    torch.manual_seed(2)
    b = small_mca()
    gen = torch.Generator().manual_seed(3)
    chunks = chunks_of(ids(gen, (2, 13), 16), [6, 6])

    def losses(mech):
        state, out = mech.init_state(2), []
        for chunk in chunks:
            state, loss = mech.step(state, chunk)
            out.append(float(loss))
        return out

    assert losses(a) != losses(b)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b.load_state_dict(torch.load(buffer))
    assert losses(a) == losses(b)


# ---- torch.save / torch.load / deepcopy ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_save_and_load_module_and_state_then_continue(dtype):
    """Module and state saved mid-stream and loaded continue with bitwise the losses of the original; loading does
    not consume the caller's random stream; deepcopy gives an independent copy."""
    torch.manual_seed(4)
    mech = small_mca().to(dtype)
    mech.ln_f.bias.requires_grad_(False)
    mech.eval()
    gen = torch.Generator().manual_seed(7)
    chunks = chunks_of(ids(gen, (2, 31), 16), [6] * 5)
    state = mech.init_state(2)
    for chunk in chunks[:2]:
        state, _ = mech.step(state, chunk)
    buffer = io.BytesIO()
    torch.save({"mech": mech, "state": state}, buffer)
    buffer.seek(0)
    torch.manual_seed(10)
    expected_draw = torch.rand(2)
    torch.manual_seed(10)
    loaded = torch.load(buffer)
    assert torch.equal(torch.rand(2), expected_draw)
    mech2, state2 = loaded["mech"], loaded["state"]
    assert isinstance(mech2, MomentClosureAttention) and isinstance(state2, MomentClosureState)
    assert mech2.tok.weight.dtype == dtype and not mech2.training
    assert not mech2.ln_f.bias.requires_grad and mech2.ln_f.weight.requires_grad
    assert mech2.head.weight is mech2.tok.weight
    assert_receipts_close(mech2.last_receipts, mech.last_receipts, 0.0)
    assert mech2.last_misfit == mech.last_misfit
    twin = copy.deepcopy(mech)
    twin_state = copy.deepcopy(mech.detach(state))  # torch deep-copies graph leaves only
    for chunk in chunks[2:]:
        state, loss = mech.step(state, chunk)
        state2, loss2 = mech2.step(state2, chunk)
        twin_state, loss3 = twin.step(twin_state, chunk)
        assert float(loss) == float(loss2) == float(loss3)
    with torch.no_grad():
        twin.qkv[0].weight.zero_()
    assert not torch.equal(twin.qkv[0].weight, mech.qkv[0].weight)


def test_sliding_window_module_and_state_pickle():
    torch.manual_seed(4)
    mech = SlidingWindowSpine(16, d_model=16, n_layer=1, n_head=2, window=None)
    gen = torch.Generator().manual_seed(8)
    chunks = chunks_of(ids(gen, (1, 13), 16), [6, 6])
    state, _ = mech.step(mech.init_state(1), chunks[0])
    buffer = io.BytesIO()
    torch.save((mech, state), buffer)
    buffer.seek(0)
    mech2, state2 = torch.load(buffer)
    assert mech2.window is None and state2.pos == 6
    assert float(mech.step(state, chunks[1])[1]) == float(mech2.step(state2, chunks[1])[1])


# ---- the reference design's usage ---------------------------------------------------------------------------


def test_reference_usage_patterns():
    """The reference's one-stream patterns: attributes, per-layer receipts with accounting, last_misfit, and states
    whose banks have the one-stream layout (batch 1), which steps keep and compute as the streams layout does."""
    torch.manual_seed(5)
    mech = small_mca()
    assert (mech.vocab, mech.d_model, mech.n_layer, mech.n_head, mech.head_dim, mech.window) == (16, 16, 2, 2, 8, 4)
    assert (mech.max_clusters, mech.birth_threshold, mech.merge_threshold) == (3, -2.0, None)
    assert mech.last_receipts == [] and mech.last_misfit == 0.0
    gen = torch.Generator().manual_seed(9)
    chunks = chunks_of(ids(gen, (1, 19), 16), [6, 6, 6])
    state = mech.init_state(1)
    one = MomentClosureState(
        near=SlidingWindowState(cache_k=[None, None], cache_v=[None, None], pos=0),
        banks=[empty_cluster_bank(None, 2, 3, 8) for _ in range(2)],
    )
    for chunk in chunks:
        state, loss = mech.step(state, chunk)
        one, loss_one = mech.step(one, chunk)
        assert float(loss) == float(loss_one)
    bank = state.banks[0]
    assert isinstance(bank, ClusterBank) and bank.count.shape == (1, 2, 3)
    assert isinstance(bank.n_clusters, list) and bank.n_clusters[0] >= 1
    assert isinstance(one.banks[0].n_clusters, int) and one.banks[0].n_clusters == bank.n_clusters[0]
    assert one.banks[0].count.shape == (2, 3)
    assert torch.equal(one.banks[0].mu_k, bank.mu_k[0])
    receipt = mech.last_receipts[0]
    assert receipt["batch_size"] == 1 and len(receipt["streams"]) == 1
    stream = receipt["streams"][0]
    assert stream["accounting"]["conserved"] and stream["accounting"]["positions_seen"] == 18
    assert stream["accounting"]["near_tokens"] == 4 and stream["count_conserved"]
    assert mech.last_misfit == pytest.approx(sum(r["misfit_scalar"] for r in mech.last_receipts) / 2)
    assert all(0.0 <= r["far_attention_share"] <= 1.0 for r in mech.last_receipts)
    assert state.near.pos == 18 and state.near.cache_k[0].shape == (1, 4, 2, 8)
    # The reference's shared one-stream bank cannot serve a batch: ValueError, not a silent shared far field.
    two = MomentClosureState(
        near=mech.init_state(2).near, banks=[empty_cluster_bank(None, 2, 3, 8) for _ in range(2)], batch_size=2
    )
    with pytest.raises(ValueError, match="batch size"):
        mech.step(two, chunks_of(ids(gen, (2, 7), 16), [6])[0])


# ---- errors ---------------------------------------------------------------------------------------------------


def test_a_changed_batch_size_and_a_tampered_bank():
    """acceptance task MCA-9: a changed batch size → ValueError "batch size"; a tampered bank count → RuntimeError
    "one-token/one-representation" (a new tensor, or the state's own tensor changed in place)."""
    torch.manual_seed(6)
    mech = small_mca()
    gen = torch.Generator().manual_seed(10)
    tokens = ids(gen, (2, 19), 16)
    chunks = chunks_of(tokens, [6, 6, 6])
    state = mech.init_state(2)
    for chunk in chunks[:2]:
        state, _ = mech.step(state, chunk)
    state = mech.detach(state)
    with pytest.raises(ValueError, match="batch size"):
        mech.step(state, chunks_of(tokens[:1], [6])[0])
    assert state.banks[0].n_clusters[0] >= 1
    count = state.banks[0].count.clone()
    count[0, 0, 0] += 1.0
    tampered = dataclasses.replace(state, banks=[dataclasses.replace(state.banks[0], count=count)] + state.banks[1:])
    with pytest.raises(RuntimeError, match="one-token/one-representation"):
        mech.step(tampered, chunks[2])
    mech.step(state, chunks[2])  # the untampered state still steps
    state = mech.detach(state)  # the module's last state: its banks are known, unless changed in place
    mech.step(state, chunks[2])
    state = mech.detach(state)
    with torch.no_grad():
        state.banks[1].count[1, 0, 0] += 0.5
    with pytest.raises(RuntimeError, match="one-token/one-representation"):
        mech.step(state, chunks[2])
    with torch.no_grad():
        state.banks[1].count[1, 0, 0] -= 0.5
        state.banks[1].mu_k[0, 0, 2] = 1.0  # an inactive slot
    if state.banks[1].n_clusters[0] < 3:
        with pytest.raises(ValueError, match=r"banks\[1\]"):
            mech.step(state, chunks[2])


def test_bad_chunks_raise_naming_the_argument():
    torch.manual_seed(7)
    gen = torch.Generator().manual_seed(11)
    x = ids(gen, (2, 6), 16)
    for mech in (small_mca(), SlidingWindowSpine(16, d_model=16, n_layer=2, n_head=2, window=4)):
        state = mech.init_state(2)
        with pytest.raises(ValueError, match=r"\bx\b.*int64"):
            mech.step(state, (x.float(), x))
        with pytest.raises(ValueError, match=r"\by\b.*int64"):
            mech.step(state, (x, x.to(torch.int32)))
        with pytest.raises(TypeError, match=r"\bx\b.*torch.Tensor"):
            mech.step(state, (x.tolist(), x))
        with pytest.raises(ValueError, match="chunk"):
            mech.step(state, [x, x])
        with pytest.raises(ValueError, match="chunk"):
            mech.step(state, (x, x, x))
        with pytest.raises(ValueError, match="same shape"):
            mech.step(state, (x, x[:, :5]))
        with pytest.raises(ValueError, match=r"\by\b.*vocabulary"):
            mech.step(state, (x, x + 16))
        with pytest.raises(ValueError, match=r"\bx\b.*vocabulary"):
            mech.step(state, (x - 20, x))
        with pytest.raises(ValueError, match="x"):
            mech.step(state, (x[:, :0], x[:, :0]))
        with pytest.raises(ValueError, match="x"):
            mech.step(state, (x[0], x[0]))
        with pytest.raises(ValueError, match="batch size"):
            mech.step(mech.init_state(3), (x, x))
        with pytest.raises(TypeError, match="state"):
            mech.step(None, (x, x))
        for bad in (0, -1, True, 1.0, "2"):
            with pytest.raises(ValueError, match="batch_size"):
                mech.init_state(bad)
        for device in ("meta", torch.device("cuda")):
            with pytest.raises(ValueError, match="CPU"):
                mech.init_state(1, device=device)


def test_states_from_other_models_are_refused():
    torch.manual_seed(8)
    gen = torch.Generator().manual_seed(12)
    chunk = chunks_of(ids(gen, (2, 7), 16), [6])[0]
    mca = small_mca()
    spine = SlidingWindowSpine(16, d_model=16, n_layer=2, n_head=2, window=4)
    with pytest.raises(TypeError, match="MomentClosureState"):
        mca.step(spine.init_state(2), chunk)
    with pytest.raises(TypeError, match="SlidingWindowState"):
        spine.step(mca.init_state(2), chunk)
    with pytest.raises(ValueError, match="per layer"):
        mca.step(small_mca(n_layer=1).init_state(2), chunk)
    other_heads = small_mca(n_head=4)
    state, _ = other_heads.step(other_heads.init_state(2), chunk)
    with pytest.raises(ValueError):
        mca.step(state, chunk)
    state, _ = mca.step(mca.init_state(2), chunk)
    with pytest.raises(ValueError, match="max_clusters|layout"):
        small_mca(max_clusters=2).step(state, chunk)
    with pytest.raises(TypeError, match="ClusterBank"):
        mca.step(dataclasses.replace(state, banks=[None, None]), chunk)
    with pytest.raises(TypeError, match="banks"):
        mca.step(dataclasses.replace(state, banks=None), chunk)
    with pytest.raises(ValueError, match="pos"):
        mca.step(dataclasses.replace(state, near=dataclasses.replace(state.near, pos=-1)), chunk)
    with pytest.raises(TypeError, match="detach_horizon_clusters"):
        mca.step(dataclasses.replace(state, detach_horizon_clusters=1), chunk)
    with pytest.raises(ValueError, match="cache_k"):
        spine.step(SlidingWindowState(cache_k=[None], cache_v=[None]), chunk)
    k = torch.zeros(2, 3, 2, 8)
    with pytest.raises(ValueError, match="cache"):
        spine.step(SlidingWindowState(cache_k=[k, k], cache_v=[None, None], pos=3, batch_size=2), chunk)
    with pytest.raises(ValueError, match=r"cache_k\[0\].*float64"):
        spine.step(SlidingWindowState(cache_k=[k.double(), k], cache_v=[k, k], pos=3, batch_size=2), chunk)
    float_state = mca.init_state(2)
    mca.double()
    with pytest.raises(ValueError, match="dtype|float"):
        mca.step(float_state, chunk)
    mca.step(mca.init_state(2), chunk)


def test_broken_modules_are_refused():
    gen = torch.Generator().manual_seed(13)
    chunk = chunks_of(ids(gen, (1, 7), 16), [6])[0]
    mech = small_mca()
    mech.qkv[0].double()
    with pytest.raises(ValueError, match="whole module"):
        mech.step(mech.init_state(1), chunk)
    mech = small_mca().half()
    with pytest.raises(ValueError, match="float32 or float64"):
        mech.step(mech.init_state(1), chunk)
    mech = small_mca()
    mech.proj[1].bias = torch.nn.Parameter(torch.zeros(16))
    with pytest.raises(RuntimeError, match="replaced"):
        mech.step(mech.init_state(1), chunk)
    mech = small_mca()
    mech.mlp[0][2] = torch.nn.Linear(64, 16)
    with pytest.raises(RuntimeError, match="replaced"):
        mech.step(mech.init_state(1), chunk)
    mech = small_mca()
    with torch.no_grad():
        mech.proj[1].bias.data = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        mech.step(mech.init_state(1), chunk)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocab=0), "vocab"),
        (dict(vocab=True), "vocab"),
        (dict(vocab=16.0), "vocab"),
        (dict(d_model=30, n_head=4), "divisible"),
        (dict(d_model=6, n_head=2), "even"),
        (dict(n_layer=0), "n_layer"),
        (dict(window=0), "window"),
    ],
)
def test_constructor_errors(kwargs, match):
    args = dict(vocab=16, d_model=16, n_layer=1, n_head=2, window=4)
    args.update(kwargs)
    vocab = args.pop("vocab")
    for cls in (SlidingWindowSpine, MomentClosureAttention):
        with pytest.raises(ValueError, match=match):
            cls(vocab, **args)


def test_mechanism_specific_constructor_errors():
    with pytest.raises(ValueError, match="cp_size"):
        SlidingWindowSpine(16, cp_size=2)
    with pytest.raises(ValueError, match="window"):
        MomentClosureAttention(16, window=None)
    for kw in (dict(max_clusters=0), dict(birth_threshold=math.nan), dict(merge_threshold=math.inf),
               dict(birth_threshold="x")):
        with pytest.raises(ValueError, match=next(iter(kw))):
            MomentClosureAttention(16, **kw)
    assert SlidingWindowSpine(16, window=None).window is None
    assert MomentClosureAttention(16, merge_threshold=3).merge_threshold == 3.0


# ---- gradients through the far field -------------------------------------------------------------------------


def test_gradcheck_through_the_bank():
    """The loss of a chunk that attends to a bank soft-updated in the previous chunk, against central differences
    (float64), with respect to two parameters and the far-field statistics carried in from before. Births are kept
    out of the checked steps (they carry no gradient, by design): the first chunk births the one cluster outside the
    checked function, and a birth threshold of -1e9 makes every later chunk update it softly."""
    torch.manual_seed(9)
    mech = MomentClosureAttention(8, d_model=8, n_layer=1, n_head=2, window=2, max_clusters=1,
                                  birth_threshold=-1e9).double()
    gen = torch.Generator().manual_seed(14)
    chunks = chunks_of(ids(gen, (1, 10), 8), [3, 3, 3])
    with torch.no_grad():
        start, _ = mech.step(mech.init_state(1), chunks[0])
    assert start.banks[0].n_clusters == [1]
    mu_v = start.banks[0].mu_v.clone().requires_grad_()
    mu_k = start.banks[0].mu_k.clone().requires_grad_()
    inputs = (mech.qkv[0].bias, mech.proj[0].weight, mu_v, mu_k)
    receipts = []

    def loss(*_):
        bank = dataclasses.replace(start.banks[0], mu_v=mu_v, mu_k=mu_k)
        state, _ = mech.step(dataclasses.replace(start, banks=[bank]), chunks[1])
        receipts.append(mech.last_receipts[0]["streams"][0])
        _, out = mech.step(state, chunks[2])
        return out

    assert torch.autograd.gradcheck(loss, inputs, **GRADCHECK)
    assert receipts and all(r["soft_update_applied"] and not r["birthed"] for r in receipts)
    out = loss()
    grads = torch.autograd.grad(out, inputs)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
