# SPDX-License-Identifier: Apache-2.0
"""attnmix.torch's bounded linear-feature memories (LinearAttentionSpine, FrequentDirectionsSpine, TensorSketchSpine)
and moment closure's outlier store (MomentClosureAttention(outlier_capacity=N)) as torch.nn.Modules (ctest labels
python;torch).

Oracles: the C++ trainer (train_language_model, the code `attnmix lm train` runs) from the same seed, losses equal
to the bit; checkpoints of lm train scored by evaluate_language_model; one pass vs chunks (linear attention, exact in
float64); each stream alone vs the batch; torch.autograd.gradcheck (float64 central differences). Every tampered
state raises TypeError or ValueError naming the field."""
import copy
import dataclasses
import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnmix.experimental as ex
from attnmix.torch import (
    FrequentDirectionsSpine,
    LinearAttentionSpine,
    MomentClosureAttention,
    OutlierStore,
    TensorSketchSpine,
    train_tbptt,
)

# mechanism name of lm train → (class, its sizes beyond d_model/n_layer/n_head, lm train's flags for them)
MECHANISMS = {
    "linear": (LinearAttentionSpine, {}, {}),
    "frequent-directions": (FrequentDirectionsSpine, dict(window=8, sketch_rows=4), dict(window=8, sketch_rows=4)),
    "tensor-sketch": (
        TensorSketchSpine,
        dict(window=8, sketch_dim=16, sketch_degree=2),
        dict(window=8, sketch_dim=16, sketch_degree=2),
    ),
    "moment-closure+outliers": (
        MomentClosureAttention, dict(window=8, max_clusters=3, outlier_capacity=2),
        dict(mechanism="moment-closure", window=8, max_clusters=3, outlier_capacity=2),
    ),
    # the budget rule with two slots: from the third evicted chunk on, every chunk makes room by a merge
    "moment-closure budget": (
        MomentClosureAttention, dict(window=8, max_clusters=2, outlier_capacity=2, cluster_rule="budget"),
        dict(mechanism="moment-closure", window=8, max_clusters=2, outlier_capacity=2, cluster_rule="budget"),
    ),
}
SIZES = dict(d_model=16, n_layer=2, n_head=2)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(name, vocab=32, **kw):
    cls, extra, _ = MECHANISMS[name]
    return cls(vocab, **SIZES, **{**extra, **kw})


def lm_flags(name):
    _, _, flags = MECHANISMS[name]
    return {"mechanism": name, **flags}


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_adamw_training_from_python_equals_lm_train(name):
    """20 steps of train_tbptt with torch.optim.AdamW and gradient clipping on lm train's data layout (2 streams,
    passes of 10 chunks, a state reset at each, detach horizon 2) give train_language_model's losses to the bit."""
    vocab, batch, chunk, seed, lr, wd, clip = 32, 2, 8, 5, 3e-3, 0.01, 1.0
    tokens = np.random.default_rng(11).integers(0, vocab, size=170)
    summary = ex.train_language_model(
        tokens, vocab=vocab, batch=batch, chunk=chunk, steps=20, detach_horizon=2, lr=lr, schedule="constant",
        weight_decay=wd, clip=clip, seed=seed, threads=1, **SIZES, **lm_flags(name),
    )
    torch.manual_seed(seed)
    mech = make(name, vocab)
    opt = torch.optim.AdamW(mech.parameters(), lr=lr, weight_decay=wd)
    in_cpp_order = [p for _, p in mech._native.named_parameters()]
    data = torch.from_numpy(tokens).reshape(batch, -1)
    losses = []
    for _ in range(2):
        passes = [(data[:, o : o + chunk], data[:, o + 1 : o + 1 + chunk]) for o in range(0, 80, chunk)]
        result = train_tbptt(
            mech, mech.init_state(batch), passes, opt, detach_horizon=2,
            before_update=lambda k: torch.nn.utils.clip_grad_norm_(in_cpp_order, clip),
        )
        losses += result["losses"]
    assert len(losses) == len(summary["losses"]) == 20
    assert losses == summary["losses"]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_a_checkpoint_scores_as_the_cpp_evaluation(tmp_path, name):
    vocab = 32
    tokens = np.random.default_rng(3).integers(0, vocab, size=400)
    ckpt = tmp_path / "m.ckpt"
    ex.train_language_model(tokens[:300], out=str(ckpt), vocab=vocab, batch=2, chunk=8, steps=4, seed=2, threads=1,
                            **SIZES, **lm_flags(name))
    cls = MECHANISMS[name][0]
    mech = cls.from_checkpoint(ckpt)
    held = torch.as_tensor(tokens[300:]).reshape(1, -1)
    state, total = mech.init_state(1), 0.0
    with torch.no_grad():
        for o in range(0, held.shape[1] - 1, 8):
            t = min(8, held.shape[1] - 1 - o)
            state, logits = mech.advance(state, held[:, o : o + t])
            total += F.cross_entropy(logits[0], held[0, o + 1 : o + 1 + t], reduction="sum").item()
    theirs = ex.evaluate_language_model(str(ckpt), tokens[300:], chunk=8, threads=1)["mean_cross_entropy"]
    assert total / (held.shape[1] - 1) == theirs
    other = "linear" if name != "linear" else "tensor-sketch"
    with pytest.raises(ValueError, match="holds a"):
        MECHANISMS[other][0].from_checkpoint(ckpt)


def test_linear_attention_streams_exactly_as_one_pass():
    mech = make("linear").double()
    x = torch.randint(0, 32, (2, 30), generator=torch.Generator().manual_seed(1))
    _, whole = mech.advance(mech.init_state(2), x)
    state, parts = mech.init_state(2), []
    for a, b in [(0, 7), (7, 8), (8, 30)]:
        state, logits = mech.advance(state, x[:, a:b])
        parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-12, atol=1e-12)
    assert state.pos == 30


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_no_cross_stream_leakage(name):
    mech = make(name).double()
    x = torch.randint(0, 32, (3, 40), generator=torch.Generator().manual_seed(2))
    state = mech.init_state(3)
    alone = mech.init_state(1)
    for a in range(0, 40, 10):
        state, batch_logits = mech.advance(state, x[:, a : a + 10])
        alone, one_logits = mech.advance(alone, x[1:2, a : a + 10])
        torch.testing.assert_close(batch_logits[1:2], one_logits, rtol=1e-10, atol=1e-10)


def test_frequent_directions_receipts_hold_the_bound():
    mech = make("frequent-directions")
    state = mech.init_state(2)
    x = torch.randint(0, 32, (2, 60), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for a in range(0, 60, 12):
            state, _ = mech.advance(state, x[:, a : a + 12])
    for r in mech.receipts(state):
        assert r["window"] + r["evicted"] == 60
        assert r["shrinks"] > 0 and r["bound_holds"]
        assert bool((r["shrink_total"] <= r["bound"] * (1 + 1e-9) + 1e-12).all())


def test_gradcheck_through_the_carried_linear_sums():
    mech = make("linear").double()
    x = torch.randint(0, 32, (1, 5), generator=torch.Generator().manual_seed(4))
    s0 = mech.init_state(1)
    with torch.no_grad():
        s0, _ = mech.advance(s0, x)
    sum_kv = s0.layers[0].sum_kv.clone().requires_grad_(True)

    def f(skv):
        state = dataclasses.replace(s0, layers=[dataclasses.replace(s0.layers[0], sum_kv=skv), s0.layers[1]])
        return mech.advance(state, x[:, :3])[1]

    assert torch.autograd.gradcheck(f, (sum_kv,), eps=1e-6, atol=1e-5, rtol=1e-3)


def test_outlier_store_pickles_and_continues_bit_for_bit():
    mech = make("moment-closure+outliers")
    x = torch.randint(0, 32, (2, 41), generator=torch.Generator().manual_seed(5))
    state = mech.init_state(2)
    with torch.no_grad():
        for a in range(0, 24, 8):
            state, _ = mech.advance(state, x[:, a : a + 8])
    assert len(state.stores) == 2 and isinstance(state.stores[0], OutlierStore)
    assert int((state.stores[0].owner >= 0).sum()) > 0
    buffer = io.BytesIO()
    torch.save((mech, state), buffer)
    buffer.seek(0)
    mech2, state2 = torch.load(buffer)
    with torch.no_grad():
        _, a = mech.advance(state, x[:, 24:40])
        _, b = mech2.advance(state2, x[:, 24:40])
    assert torch.equal(a, b)
    # The store changes the answer: without it the same weights predict otherwise.
    plain = MomentClosureAttention(32, **SIZES, window=8, max_clusters=3)
    plain.load_state_dict(mech.state_dict())
    ps = plain.init_state(2)
    with torch.no_grad():
        for a_ in range(0, 24, 8):
            ps, _ = plain.advance(ps, x[:, a_ : a_ + 8])
        _, c = plain.advance(ps, x[:, 24:40])
    assert not torch.equal(a, c)


def stepped(name):
    mech = make(name)
    state = mech.init_state(2)
    x = torch.randint(0, 32, (2, 40), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        for a in range(0, 40, 10):
            state, _ = mech.advance(state, x[:, a : a + 10])
    return mech, state, x


def test_tampered_outlier_stores_are_refused():
    mech, state, x = stepped("moment-closure+outliers")
    store = state.stores[0]
    bad = {
        "owner": dataclasses.replace(store, owner=torch.full_like(store.owner, 7)),
        "capacity": dataclasses.replace(store, owner=torch.zeros_like(store.owner)),
        "free but not all zero": dataclasses.replace(store, owner=torch.full_like(store.owner, -1)),
        "k_scale": dataclasses.replace(store, k_scale=-store.k_scale - 1),
        "v_codes": dataclasses.replace(store, v_codes=store.v_codes.float()),
        "residual": dataclasses.replace(store, residual=store.residual.float()),
        "k_low": dataclasses.replace(store, k_low=torch.full_like(store.k_low, math.nan)),
        "k_hat": dataclasses.replace(store, k_hat=store.k_codes.double()),
    }
    for match, tampered in bad.items():
        with pytest.raises(ValueError, match=match):
            mech.advance(dataclasses.replace(state, stores=[tampered, state.stores[1]]), x[:, :4])
    with pytest.raises(ValueError, match="state.stores"):
        mech.advance(dataclasses.replace(state, stores=[store]), x[:, :4])
    with pytest.raises(TypeError, match="state.stores"):
        mech.advance(dataclasses.replace(state, stores=[store, "store"]), x[:, :4])
    native, _ = mech._checked(state, "w")
    with pytest.raises(TypeError, match="OutlierStore"):
        mech._native.advance((native[0], native[1], [native[2][0], "x"], native[3], native[4]), x[:, :4])


@pytest.mark.parametrize("name", ["linear", "frequent-directions", "tensor-sketch"])
def test_tampered_sketch_states_are_refused(name):
    mech, state, x = stepped(name)
    layer = state.layers[0]
    first = dataclasses.fields(layer)[0].name
    wrong_shape = dataclasses.replace(layer, **{first: getattr(layer, first)[..., :1]})
    with pytest.raises(ValueError, match="layer 0"):
        mech.advance(dataclasses.replace(state, layers=[wrong_shape, state.layers[1]]), x[:, :4])
    wrong_dtype = dataclasses.replace(layer, last_x=layer.last_x.double())
    with pytest.raises(ValueError, match="layer 0"):
        mech.advance(dataclasses.replace(state, layers=[wrong_dtype, state.layers[1]]), x[:, :4])
    with pytest.raises(TypeError, match=r"state.layers\[0\].last_x"):
        mech.advance(dataclasses.replace(state, layers=[dataclasses.replace(layer, last_x=3), state.layers[1]]),
                     x[:, :4])
    with pytest.raises(ValueError, match="batch size"):
        mech.advance(state, x[:1, :4])
    with pytest.raises(ValueError, match="one entry per layer"):
        mech.advance(dataclasses.replace(state, layers=state.layers[:1]), x[:, :4])
    with pytest.raises(TypeError, match="State"):
        mech.advance(copy.copy(state.layers), x[:, :4])
    if name == "frequent-directions":
        with pytest.raises(ValueError, match="sketch rows filled"):
            mech.advance(dataclasses.replace(state, layers=[dataclasses.replace(layer, filled=layer.filled + 1),
                                                           state.layers[1]]), x[:, :4])
    with pytest.raises(ValueError, match="vocabulary"):
        mech.advance(state, torch.full((2, 3), 99))


def test_constructor_errors():
    with pytest.raises(ValueError, match="sketch_rows"):
        FrequentDirectionsSpine(32, sketch_rows=5)
    with pytest.raises(ValueError, match="sketch_dim"):
        TensorSketchSpine(32, sketch_dim=0)
    with pytest.raises(ValueError, match="outlier_capacity"):
        MomentClosureAttention(32, outlier_capacity=-1)
    with pytest.raises(ValueError, match="cluster_rule"):
        MomentClosureAttention(32, cluster_rule="Budget")
    with pytest.raises(TypeError, match="cluster_rule"):
        MomentClosureAttention(32, cluster_rule=1)
    with pytest.raises(ValueError, match="d_model"):
        LinearAttentionSpine(32, d_model=15, n_head=2)
    with pytest.raises(ValueError, match="no entry window"):
        type(make("tensor-sketch")._native)({"vocab": 4, "d_model": 4, "n_layer": 1, "n_head": 1})
    with pytest.raises(TypeError, match="dict"):
        type(make("linear")._native)(3)
