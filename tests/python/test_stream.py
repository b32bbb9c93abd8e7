# SPDX-License-Identifier: Apache-2.0
"""attnmix.experimental (the extension attnmix._stream, docs/mechanisms.md#streaming-language-model and
#moment-closure-far-field; ctest labels python;torch): the cluster-bank functions against numpy oracles written from
docs/mechanisms.md#moment-closure-far-field, the birth/merge cases MCA-4..7, the receipts' keys, attention_law against
the exact linear push (MCA-12), the RoPE test vector (E1-1), validation errors, the RuntimeError of a bank whose
statistics overflow, and tiny language-model and recall runs on token arrays."""
import math
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import attnmix.experimental as ex

ORACLE_RTOL = 1e-12  # same formulas as the C++ (float64), different summation order
MOMENT_RTOL = 1e-10  # Chan/Welford combination vs the direct weighted moments (a different algebraic route)
COUNT_FLOOR = 1e-8  # docs/mechanisms.md#moment-closure-far-field
VARIANCE_FLOOR = 1e-6  # docs/mechanisms.md#moment-closure-far-field

BIRTH_KEYS = {
    "birthed",
    "birth_incorporated_batch",
    "merged",
    "misfit",
    "per_cluster_outlier_tokens",
    "misfit_scalar",
}
INGEST_KEYS = BIRTH_KEYS | {
    "soft_update_applied",
    "ingested_tokens_per_head",
    "expected_ingested_tokens_per_head",
    "count_conserved",
}


# ---- helpers ------------------------------------------------------------------------------------------------


def bank_arrays(rng, n_clusters, H, C, d):
    """Random statistics in the live slots of each stream, zeros elsewhere, as a dict of ClusterBank arguments."""
    B = len(n_clusters)
    a = {
        "count": np.zeros((B, H, C)),
        "mu_k": np.zeros((B, H, C, d)),
        "mu_v": np.zeros((B, H, C, d)),
        "sigma_kk": np.zeros((B, H, C, d)),
        "sigma_vk": np.zeros((B, H, C, d, d)),
    }
    for b, n in enumerate(n_clusters):
        a["count"][b, :, :n] = rng.uniform(2.0, 10.0, (H, n))
        a["mu_k"][b, :, :n] = rng.standard_normal((H, n, d))
        a["mu_v"][b, :, :n] = rng.standard_normal((H, n, d))
        a["sigma_kk"][b, :, :n] = rng.uniform(0.1, 1.0, (H, n, d))
        a["sigma_vk"][b, :, :n] = 0.3 * rng.standard_normal((H, n, d, d))
    a["n_clusters"] = np.array(n_clusters)
    return a


def uniform_bank(slots, H, C, d):
    """One stream whose live slots are given as (count, mu_k, mu_v, sigma2, sigma_vk_diag), the same on every head."""
    a = bank_arrays(np.random.default_rng(0), [0], H, C, d)
    for c, (count, mu_k, mu_v, sigma2, svk) in enumerate(slots):
        a["count"][0, :, c] = count
        a["mu_k"][0, :, c] = mu_k
        a["mu_v"][0, :, c] = mu_v
        a["sigma_kk"][0, :, c] = sigma2
        a["sigma_vk"][0, :, c] = svk * np.eye(d)
    a["n_clusters"] = np.array([len(slots)])
    return ex.ClusterBank(**a), a


def numpy_logit(q, count, mu_k, sigma_kk):
    d = q.shape[-1]
    return q @ mu_k / math.sqrt(d) + (q * q) @ sigma_kk / (2 * d) + math.log(max(count, COUNT_FLOOR))


def numpy_mgf(q, a):
    """docs/mechanisms.md#moment-closure-far-field by hand: out (B, t, n, H, d), logits (B, t, n, H)."""
    B, t, H, d = q.shape
    n = int(max(a["n_clusters"]))
    out = np.zeros((B, t, n, H, d))
    logits = np.full((B, t, n, H), -np.inf)
    for b in range(B):
        for c in range(a["n_clusters"][b]):
            for h in range(H):
                for i in range(t):
                    x = q[b, i, h]
                    logits[b, i, c, h] = numpy_logit(x, a["count"][b, h, c], a["mu_k"][b, h, c], a["sigma_kk"][b, h, c])
                    out[b, i, c, h] = a["mu_v"][b, h, c] + a["sigma_vk"][b, h, c] @ x / math.sqrt(d)
    return out, logits


def numpy_responsibilities(k, a, C):
    """softmax over the live clusters of each stream, zeros beyond them: (B, t, H, C)."""
    B, t, H, _ = k.shape
    r = np.zeros((B, t, H, C))
    _, logits = numpy_mgf(k, a) if max(a["n_clusters"]) > 0 else (None, None)
    for b in range(B):
        n = a["n_clusters"][b]
        if n == 0:
            continue
        x = logits[b, :, :n, :]  # (t, n, H)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        r[b, :, :, :n] = np.transpose(e / e.sum(axis=1, keepdims=True), (0, 2, 1))
    return r


def hand_birth(k, v, b, h):
    """docs/mechanisms.md#moment-closure-far-field birth statistics of stream b, head h: (count, mu_k, mu_v, sigma_kk,
    sigma_vk)."""
    kk, vv = k[b, :, h], v[b, :, h]
    kbar, vbar = kk.mean(axis=0), vv.mean(axis=0)
    sigma_kk = np.maximum(((kk - kbar) ** 2).mean(axis=0), VARIANCE_FLOOR)
    sigma_vk = (vv - vbar).T @ (kk - kbar) / len(kk)
    return len(kk), kbar, vbar, sigma_kk, sigma_vk


def slot(bank, b, h, c):
    return (
        bank.count[b, h, c],
        bank.mu_k[b, h, c],
        bank.mu_v[b, h, c],
        bank.sigma_kk[b, h, c],
        bank.sigma_vk[b, h, c],
    )


def assert_slot_close(actual, expected, rtol=ORACLE_RTOL, atol=1e-12):
    for x, y in zip(actual, expected):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def assert_slot_zero(bank, b, c):
    for field in (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk):
        assert not field[b, :, c].any()


# ---- the module -----------------------------------------------------------------------------------------------


def test_import_attnmix_never_loads_libtorch():
    """`import attnmix` and `import attnmix.experimental` load neither attnmix._stream nor libtorch; the first name
    looked up does."""
    code = (
        "import sys, attnmix, attnmix.experimental as ex\n"
        "maps = lambda: open('/proc/self/maps').read()\n"
        "assert 'attnmix._stream' not in sys.modules, 'imported too early'\n"
        "assert 'libtorch' not in maps(), 'libtorch loaded by import attnmix'\n"
        "ex.ClusterBank\n"
        "assert 'attnmix._stream' in sys.modules and 'libtorch' in maps()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_a_missing_extension_says_how_to_build_it():
    """Built without ATTNMIX_WITH_TORCH, attnmix.experimental imports, and its first name raises ImportError."""
    code = (
        "import sys\n"
        "sys.modules['attnmix._stream'] = None  # what a build without the extension looks like to import\n"
        "import attnmix.experimental as ex\n"
        "try:\n"
        "    ex.ClusterBank\n"
        "except ImportError as error:\n"
        "    assert 'ATTNMIX_WITH_TORCH' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_experimental_exports_every_name_of_the_extension():
    from attnmix import _stream

    public = {name for name in dir(_stream) if not name.startswith("_")}
    assert public | {"OneStreamClusterBank"} == set(ex.__all__)  # plus the reference's one-stream bank
    assert set(ex.__all__) <= set(dir(ex))
    with pytest.raises(AttributeError):
        ex.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "kind, python_type", [("TypeError", TypeError), ("ValueError", ValueError), ("StateError", RuntimeError)]
)
def test_errors_translate_like_the_core_module(kind, python_type):
    from attnmix import _stream

    with pytest.raises(python_type, match="^where: what must hold$") as info:
        _stream._raise(kind, "where: what must hold")
    assert type(info.value) is python_type


def test_one_translation_for_both_modules():
    """Issue 18: once _stream was loaded, its translator caught the ValueError base of ImpossibleEvidenceError first,
    so _core's calls raised a plain ValueError without .rows. Both modules now translate alike, with one class."""
    import attnmix
    from attnmix import _core, _stream

    assert ex.rope_tables is not None  # an attnmix.experimental function: _stream is loaded
    for module in (_core, _stream):
        with pytest.raises(attnmix.ImpossibleEvidenceError) as info:
            module._raise("ImpossibleEvidenceError", "where", [2, 5])
        assert type(info.value) is attnmix.ImpossibleEvidenceError and info.value.rows == [2, 5]
        with pytest.raises(FileNotFoundError, match="where: cannot open"):
            module._raise("IoError", "where: cannot open", error_number=2)
        with pytest.raises(ValueError, match="^where$") as plain:
            module._raise("ValueError", "where")
        assert type(plain.value) is ValueError
    # A real impossible-evidence error of a _core call, with _stream loaded.
    model = attnmix.ResponsibilityAttentionDistribution(
        np.zeros((2, 1)), np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0.0, 1.0]))
    acc = model.estimator().accumulator_factory().make()
    with pytest.raises(attnmix.ImpossibleEvidenceError) as info:
        acc.seq_update([(np.array([0, 1]), np.array([0.0]), 0), (np.array([0, 1]), np.array([0.0]), 1)],
                       np.ones(2), model)
    assert info.value.rows == [1]


# ---- ClusterBank ---------------------------------------------------------------------------------------------


def test_cluster_bank_keeps_its_arrays(rng):
    a = bank_arrays(rng, [2, 0, 3], H=2, C=3, d=4)
    bank = ex.ClusterBank(**a, max_clusters=3)
    for name in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk"):
        got = getattr(bank, name)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, a[name])
    np.testing.assert_array_equal(bank.n_clusters, [2, 0, 3])
    assert bank.n_clusters.dtype == np.int64
    assert (bank.batch_size, bank.n_head, bank.max_clusters, bank.head_dim) == (3, 2, 3, 4)
    np.testing.assert_allclose(bank.total_per_head(), a["count"].sum(axis=2), rtol=ORACLE_RTOL)
    assert repr(bank) == "ClusterBank(batch_size=3, n_head=2, max_clusters=3, head_dim=4, n_clusters=[2, 0, 3])"
    # The properties are copies: writing to one leaves the bank alone.
    bank.count[...] = -1.0
    np.testing.assert_array_equal(bank.count, a["count"])


def test_cluster_bank_pickles(rng):
    bank = ex.ClusterBank(**bank_arrays(rng, [1, 2], H=1, C=2, d=2))
    again = pickle.loads(pickle.dumps(bank))
    for name in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk", "n_clusters"):
        np.testing.assert_array_equal(getattr(again, name), getattr(bank, name))


def test_empty_cluster_bank_is_all_zeros():
    bank = ex.empty_cluster_bank(2, 3, 4, 6)
    assert bank.count.shape == (2, 3, 4) and bank.sigma_vk.shape == (2, 3, 4, 6, 6)
    assert not bank.count.any() and not bank.sigma_vk.any()
    np.testing.assert_array_equal(bank.n_clusters, [0, 0])
    assert bank.max_clusters == 4


def test_cluster_bank_rejects_broken_arrays(rng):
    good = bank_arrays(rng, [1, 2], H=2, C=3, d=2)

    def with_(**changes):
        return {**good, **changes}

    cases = [
        (with_(count=good["count"][0]), "count must be"),
        (with_(mu_k=good["mu_k"][..., :1, :]), "mu_k must be"),
        (with_(mu_v=good["mu_v"][..., :1]), "mu_v must have shape"),
        (with_(sigma_vk=good["sigma_vk"][..., 0]), "sigma_vk must have shape"),
        (with_(n_clusters=np.array([1])), "one entry per stream"),
        (with_(n_clusters=np.array([1, 4])), r"n_clusters must lie in \[0, max_clusters 3\]"),
        (with_(n_clusters=np.array([1, -1])), "n_clusters"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            ex.ClusterBank(**args)
    for name in ("count", "mu_k", "sigma_vk"):
        broken = good[name].copy()
        broken.flat[0] = np.nan
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            ex.ClusterBank(**with_(**{name: broken}))
    negative = good["sigma_kk"].copy()
    negative[0, 0, 0, 0] = -0.5
    with pytest.raises(ValueError, match="sigma_kk must be >= 0"):
        ex.ClusterBank(**with_(sigma_kk=negative))
    live_beyond_prefix = good["mu_k"].copy()
    live_beyond_prefix[0, 1, 2, 0] = 0.5  # stream 0 has one live slot
    with pytest.raises(ValueError, match="inactive slot 2 of stream 0"):
        ex.ClusterBank(**with_(mu_k=live_beyond_prefix))
    with pytest.raises(ValueError, match="max_clusters is 4"):
        ex.ClusterBank(**good, max_clusters=4)
    with pytest.raises(TypeError):
        ex.ClusterBank(**with_(count=good["count"] > 0))  # bool arrays are not reals
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ex.empty_cluster_bank(0, 1, 1, 1)
    with pytest.raises(TypeError):
        ex.empty_cluster_bank(True, 1, 1, 1)


# ---- MGF logits, responsibilities and the Chan/Welford update (docs/mechanisms.md#moment-closure-far-field) ---


def test_mgf_cluster_attention_matches_numpy(rng):
    """docs/mechanisms.md#moment-closure-far-field: logits and outputs by hand; slots beyond a stream's live prefix get
    −∞ and 0."""
    a = bank_arrays(rng, [2, 1, 0], H=2, C=3, d=3)
    bank = ex.ClusterBank(**a)
    q = rng.standard_normal((3, 4, 2, 3))
    out, logits = ex.mgf_cluster_attention(q, bank)
    want_out, want_logits = numpy_mgf(q, a)
    assert out.shape == (3, 4, 2, 2, 3) and logits.shape == (3, 4, 2, 2)
    np.testing.assert_allclose(out, want_out, rtol=ORACLE_RTOL, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(logits), np.isneginf(want_logits))
    live = np.isfinite(want_logits)
    np.testing.assert_allclose(logits[live], want_logits[live], rtol=ORACLE_RTOL)


def test_mgf_cluster_attention_of_an_empty_bank_is_empty(rng):
    out, logits = ex.mgf_cluster_attention(rng.standard_normal((2, 3, 1, 4)), ex.empty_cluster_bank(2, 1, 3, 4))
    assert out.shape == (2, 3, 0, 1, 4) and logits.shape == (2, 3, 0, 1)


def test_cluster_responsibilities_match_numpy(rng):
    """docs/mechanisms.md#moment-closure-far-field: softmax over the live clusters, exactly zero beyond them and for a
    stream without clusters."""
    a = bank_arrays(rng, [2, 1, 0], H=2, C=3, d=3)
    k = rng.standard_normal((3, 5, 2, 3))
    r = ex.cluster_responsibilities(k, ex.ClusterBank(**a))
    assert r.shape == (3, 5, 2, 3)
    np.testing.assert_allclose(r, numpy_responsibilities(k, a, 3), rtol=ORACLE_RTOL, atol=1e-15)
    assert not r[0, :, :, 2].any() and not r[1, :, :, 1:].any() and not r[2].any()
    np.testing.assert_allclose(r[:2].sum(axis=-1), 1.0, rtol=1e-14)


def test_update_cluster_bank_equals_numpy_weighted_moments(rng):
    """docs/mechanisms.md#moment-closure-far-field: the bank combined with a weighted batch holds the population moments
    of the pooled population (the old cluster as n₀ tokens with its mean and covariances, plus the batch weighted by r),
    computed directly."""
    B, t, H, C, d = 2, 6, 2, 3, 3
    a = bank_arrays(rng, [C, C], H, C, d)
    k, v = rng.standard_normal((B, t, H, d)), rng.standard_normal((B, t, H, d))
    r = rng.dirichlet(np.ones(C), size=(B, t, H))
    bank = ex.update_cluster_bank(ex.ClusterBank(**a), k, v, r)
    for b in range(B):
        for h in range(H):
            for c in range(C):
                n0, w = a["count"][b, h, c], r[b, :, h, c]
                mk0, mv0 = a["mu_k"][b, h, c], a["mu_v"][b, h, c]
                kk, vv = k[b, :, h], v[b, :, h]
                n = n0 + w.sum()
                mk = (n0 * mk0 + w @ kk) / n
                mv = (n0 * mv0 + w @ vv) / n
                skk = (n0 * (a["sigma_kk"][b, h, c] + (mk0 - mk) ** 2) + w @ (kk - mk) ** 2) / n
                svk = (
                    n0 * (a["sigma_vk"][b, h, c] + np.outer(mv0 - mv, mk0 - mk))
                    + ((vv - mv) * w[:, None]).T @ (kk - mk)
                ) / n
                assert_slot_close(slot(bank, b, h, c), (n, mk, mv, skk, svk), rtol=MOMENT_RTOL)
    np.testing.assert_array_equal(bank.n_clusters, a["n_clusters"])


def test_update_cluster_bank_with_zero_weight_leaves_the_bank_unchanged(rng):
    a = bank_arrays(rng, [2], H=1, C=2, d=2)
    k = rng.standard_normal((1, 3, 1, 2))
    bank = ex.update_cluster_bank(ex.ClusterBank(**a), k, k, np.zeros((1, 3, 1, 2)))
    for name in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk"):
        np.testing.assert_allclose(getattr(bank, name), a[name], rtol=0, atol=1e-15)


def test_two_sequential_updates_equal_one_batch(rng):
    """MCA-3 (H 2, C 3, d 4, t 5 then 7, random softmax r): two updates of a bank equal one of the concatenation."""
    H, C, d = 2, 3, 4
    start = ex.ClusterBank(**bank_arrays(rng, [C], H, C, d))
    k, v = rng.standard_normal((1, 12, H, d)), rng.standard_normal((1, 12, H, d))
    r = rng.dirichlet(np.ones(C), size=(1, 12, H))
    first = ex.update_cluster_bank(start, k[:, :5], v[:, :5], r[:, :5])
    two = ex.update_cluster_bank(first, k[:, 5:], v[:, 5:], r[:, 5:])
    one = ex.update_cluster_bank(start, k, v, r)
    np.testing.assert_allclose(two.count, one.count, rtol=0, atol=1e-8)
    for name in ("mu_k", "mu_v", "sigma_kk", "sigma_vk"):
        np.testing.assert_allclose(getattr(two, name), getattr(one, name), rtol=1e-5, atol=1e-6)


# ---- birth, merge, misfit, ingestion (docs/mechanisms.md#moment-closure-far-field) ---------------------------


def test_births_for_far_chunks_only(rng):
    """MCA-4: an empty bank plus 8 tokens around +5 (σ 0.1, d 3, two heads, threshold −2) births cluster 0 with the
    hand birth statistics; 8 tokens around −5 birth cluster 1; a third chunk around +5 goes through the soft update."""
    H, C, d, t = 2, 4, 3, 8
    k1, v1 = 5 + 0.1 * rng.standard_normal((1, t, H, d)), rng.standard_normal((1, t, H, d))
    k2, v2 = -5 + 0.1 * rng.standard_normal((1, t, H, d)), rng.standard_normal((1, t, H, d))
    k3, v3 = 5 + 0.1 * rng.standard_normal((1, t, H, d)), rng.standard_normal((1, t, H, d))

    first, (r1,) = ex.ingest_cluster_batch(ex.empty_cluster_bank(1, H, C, d), k1, v1, birth_threshold=-2.0)
    np.testing.assert_array_equal(first.n_clusters, [1])
    assert r1["birthed"] and r1["birth_incorporated_batch"] and not r1["soft_update_applied"]
    assert r1["merged"] == []
    for h in range(H):
        assert_slot_close(slot(first, 0, h, 0), hand_birth(k1, v1, 0, h))

    second, (r2,) = ex.ingest_cluster_batch(first, k2, v2, birth_threshold=-2.0)
    np.testing.assert_array_equal(second.n_clusters, [2])
    assert r2["birthed"] and r2["birth_incorporated_batch"] and not r2["soft_update_applied"]
    for h in range(H):
        assert_slot_close(slot(second, 0, h, 0), hand_birth(k1, v1, 0, h))
        assert_slot_close(slot(second, 0, h, 1), hand_birth(k2, v2, 0, h))
    assert_slot_zero(second, 0, 2)
    assert_slot_zero(second, 0, 3)
    alone, (ra,) = ex.birth_and_merge(first, k2, v2, birth_threshold=-2.0)
    assert ra["birthed"]
    np.testing.assert_array_equal(alone.sigma_vk, second.sigma_vk)

    third, (r3,) = ex.ingest_cluster_batch(second, k3, v3, birth_threshold=-2.0)
    np.testing.assert_array_equal(third.n_clusters, [2])
    assert not r3["birthed"] and not r3["birth_incorporated_batch"] and r3["soft_update_applied"]
    assert r3["count_conserved"]
    np.testing.assert_allclose(third.total_per_head(), second.total_per_head() + t, rtol=1e-12)


def test_close_clusters_merge():
    """MCA-5: two clusters of count 20 at μ_k [1,2,3] and [1.01,2.01,3.01] (σ² 1, Σ_vk 0.1·I), a chunk at the shared
    location, threshold −1e6: no birth, merged == [(0, 1)] at distance 0.01, one cluster left holding the pooled
    statistics, slot 1 zeroed."""
    H, C, d = 2, 3, 3
    ma, mb = np.array([1.0, 2.0, 3.0]), np.array([1.01, 2.01, 3.01])
    va, vb = np.array([0.1, -0.2, 0.3]), np.array([0.5, 0.4, -0.6])
    bank, _ = uniform_bank([(20.0, ma, va, 1.0, 0.1), (20.0, mb, vb, 1.0, 0.1)], H, C, d)
    rng = np.random.default_rng(714)
    k, v = 2.005 + 0.05 * rng.standard_normal((1, 6, H, d)), rng.standard_normal((1, 6, H, d))
    merged, (r,) = ex.birth_and_merge(bank, k, v, birth_threshold=-1e6)
    assert not r["birthed"] and not r["birth_incorporated_batch"]
    assert r["merged"] == [(0, 1)]
    assert r["merge_distances"] == pytest.approx([0.01], abs=1e-12)
    np.testing.assert_array_equal(merged.n_clusters, [1])
    mk, mv = (ma + mb) / 2, (va + vb) / 2
    skk = 1.0 + (ma - mb) ** 2 / 4  # (20 + 20 + δ²·20·20/40) / 40
    svk = 0.1 * np.eye(d) + np.outer(va - vb, ma - mb) / 4
    for h in range(H):
        assert_slot_close(slot(merged, 0, h, 0), (40.0, mk, mv, skk, svk))
    assert_slot_zero(merged, 0, 1)
    assert list(r["misfit"]) == [0]
    assert r["per_cluster_outlier_tokens"][0]["member_indices"] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("threshold, merges", [(3.0, False), (9.999, False), (10.001, True)])
def test_distant_clusters_merge_only_above_their_distance(threshold, merges):
    """MCA-6: μ_k [0,1] vs [1,0] with σ² 0.01 and count 100 are 10 pooled standard deviations apart."""
    slots = [(100.0, [0.0, 1.0], [0.0, 0.0], 0.01, 0.0), (100.0, [1.0, 0.0], [0.0, 0.0], 0.01, 0.0)]
    bank, _ = uniform_bank(slots, 1, 2, 2)
    rng = np.random.default_rng(715)
    k, v = 0.5 + 0.05 * rng.standard_normal((1, 4, 1, 2)), rng.standard_normal((1, 4, 1, 2))
    out, (r,) = ex.birth_and_merge(bank, k, v, birth_threshold=-1e6, merge_threshold=threshold)
    assert not r["birthed"]
    if merges:
        np.testing.assert_array_equal(out.n_clusters, [1])
        assert r["merge_distances"] == pytest.approx([10.0], abs=1e-10)
    else:
        np.testing.assert_array_equal(out.n_clusters, [2])
        assert r["merged"] == [] and "merge_distances" not in r


def test_birth_ingestion_counts_the_batch_once(rng):
    """MCA-7: a (1, 3, 2, 4) batch ingested into an empty bank."""
    k, v = rng.standard_normal((1, 3, 2, 4)), rng.standard_normal((1, 3, 2, 4))
    bank, (r,) = ex.ingest_cluster_batch(ex.empty_cluster_bank(1, 2, 4, 4), k, v, birth_threshold=-2.0)
    np.testing.assert_array_equal(bank.total_per_head(), [[3.0, 3.0]])
    assert r["birthed"] and r["birth_incorporated_batch"] and not r["soft_update_applied"] and r["count_conserved"]
    assert r["ingested_tokens_per_head"] == [3.0, 3.0]
    assert r["expected_ingested_tokens_per_head"] == 3


def test_receipts_hold_the_spec_keys(rng):
    """docs/mechanisms.md#moment-closure-far-field: one receipt per stream; merge_distances only where a merge
    happened."""
    a = bank_arrays(rng, [2, 0], H=2, C=3, d=2)
    k, v = rng.standard_normal((2, 4, 2, 2)), rng.standard_normal((2, 4, 2, 2))
    _, receipts = ex.birth_and_merge(ex.ClusterBank(**a), k, v, birth_threshold=-2.0, merge_threshold=-1.0)
    assert len(receipts) == 2
    for r in receipts:
        assert set(r) == BIRTH_KEYS
    _, receipts = ex.ingest_cluster_batch(ex.ClusterBank(**a), k, v, birth_threshold=-1e6, merge_threshold=1e6)
    assert len(receipts) == 2
    assert set(receipts[1]) == INGEST_KEYS  # stream 1 (empty) births its only cluster: nothing to merge
    assert set(receipts[0]) == INGEST_KEYS | {"merge_distances"}  # stream 0's two clusters merge, no birth
    assert receipts[0]["merged"] == [(0, 1)] and isinstance(receipts[0]["merged"][0], tuple)
    for r in receipts:
        assert isinstance(r["misfit_scalar"], float) and r["count_conserved"]
        for c, tokens in r["per_cluster_outlier_tokens"].items():
            assert isinstance(c, int) and c in r["misfit"]
            assert set(tokens) == {"k", "v", "indices", "residuals", "member_indices"}
            assert tokens["k"].shape == tokens["v"].shape == (len(tokens["indices"]), 2, 2)


def test_misfit_receipt_matches_numpy(rng):
    """docs/mechanisms.md#moment-closure-far-field misfit with one live cluster: every token is a member; the residual
    of the diagonal regression ||v − (μ_v + Σ_vk (k − μ_k)/σ²_kk)||, averaged over heads; outliers are the top-k
    residuals, largest first."""
    H, d, t = 2, 3, 7
    a = bank_arrays(rng, [1], H, 2, d)
    k, v = rng.standard_normal((1, t, H, d)), rng.standard_normal((1, t, H, d))
    _, (r,) = ex.birth_and_merge(ex.ClusterBank(**a), k, v, birth_threshold=-1e6, outlier_top_k=3)
    residual = np.zeros(t)
    for h in range(H):
        pred = a["mu_v"][0, h, 0] + (k[0, :, h] - a["mu_k"][0, h, 0]) / np.maximum(
            a["sigma_kk"][0, h, 0], VARIANCE_FLOOR
        ) @ a["sigma_vk"][0, h, 0].T
        residual += np.linalg.norm(v[0, :, h] - pred, axis=1) / H
    assert list(r["misfit"]) == [0]
    assert r["misfit"][0] == pytest.approx(residual.mean(), rel=ORACLE_RTOL)
    assert r["misfit_scalar"] == pytest.approx(residual.mean(), rel=ORACLE_RTOL)
    outliers = r["per_cluster_outlier_tokens"][0]
    assert outliers["member_indices"] == list(range(t))
    assert outliers["indices"] == list(np.argsort(-residual)[:3])
    np.testing.assert_array_equal(outliers["k"], k[0, outliers["indices"]])
    np.testing.assert_array_equal(outliers["v"], v[0, outliers["indices"]])


def test_birth_and_merge_validates_its_arguments(rng):
    bank = ex.ClusterBank(**bank_arrays(rng, [1], H=2, C=2, d=3))
    k = rng.standard_normal((1, 4, 2, 3))
    for call in (ex.birth_and_merge, ex.ingest_cluster_batch):
        with pytest.raises(ValueError, match="equal"):
            call(bank, k, k[:, :3], birth_threshold=-2.0)
        with pytest.raises(ValueError, match="batch size"):
            call(bank, np.concatenate([k, k]), np.concatenate([k, k]), birth_threshold=-2.0)
        with pytest.raises(ValueError, match="head dimensions"):
            call(bank, k[..., :2], k[..., :2], birth_threshold=-2.0)
        with pytest.raises(ValueError, match="finite"):
            call(bank, np.full_like(k, np.inf), k, birth_threshold=-2.0)
        for top_k in (-1, 1.5, True):
            with pytest.raises(ValueError, match="outlier_top_k"):
                call(bank, k, k, birth_threshold=-2.0, outlier_top_k=top_k)
        with pytest.raises(TypeError):
            call(bank, k, k)  # birth_threshold is a required keyword (docs/mechanisms.md#moment-closure-far-field)
    with pytest.raises(ValueError, match="q must be"):
        ex.mgf_cluster_attention(k[:, :, :1], bank)
    with pytest.raises(ValueError, match="k must be"):
        ex.cluster_responsibilities(k[0], bank)
    with pytest.raises(ValueError, match="responsibilities must be"):
        ex.update_cluster_bank(bank, k, k, np.ones((1, 4, 2, 3)))


def test_overflowing_statistics_raise_runtime_error(rng):
    """StateError → RuntimeError (docs/mechanisms.md#building-blocks and #moment-closure-far-field) for a bank whose
    finite statistics overflow: two clusters at ±1e300 have a non-finite distance; one cluster at 1e308 gives infinite
    logits, so the soft update cannot count the batch."""
    H, C, d = 1, 2, 4
    far, _ = uniform_bank([(5.0, 1e300, 0.0, 1.0, 0.0), (5.0, -1e300, 0.0, 1.0, 0.0)], H, C, d)
    k = rng.uniform(0.5, 1.0, (1, 3, H, d))
    with pytest.raises(RuntimeError, match="distance between clusters 0 and 1 is not finite"):
        ex.birth_and_merge(far, k, k, birth_threshold=-2.0)
    huge, _ = uniform_bank([(5.0, 1e308, 0.0, 1.0, 0.0)], H, C, d)
    with pytest.raises(RuntimeError, match="did not count every observation exactly once"):
        ex.ingest_cluster_batch(huge, k, k, birth_threshold=-2.0)


# ---- attention_law (docs/mechanisms.md#moment-closure-far-field) and RoPE
# (docs/mechanisms.md#streaming-language-model) ---------------------------------------------------------------


def test_attention_law_is_the_exact_linear_push(rng):
    """MCA-12: the law of the attention output and the query-path Jacobian against numpy, to 1e-12."""
    dm, n_head = 4, 2
    hd = dm // n_head
    W, bq = rng.standard_normal((3 * dm, dm)), rng.standard_normal(3 * dm)
    P, bp = rng.standard_normal((dm, dm)), rng.standard_normal(dm)
    mean_h = rng.standard_normal(dm)
    L = rng.standard_normal((dm, dm))
    cov_h = L @ L.T + np.eye(dm)
    law, jacobian = ex.attention_law(ex.GaussianLaw(mean_h, cov_h), W, bq, P, bp, n_head)

    mu, S = W @ mean_h + bq, W @ cov_h @ W.T
    q, k, v = slice(0, dm), slice(dm, 2 * dm), slice(2 * dm, 3 * dm)
    A = np.zeros((dm, dm))
    for h in range(n_head):
        rows = slice(h * hd, (h + 1) * hd)
        A[rows, rows] = S[v, k][rows, rows] / math.sqrt(hd)
    mean_pre, cov_pre = mu[v] + A @ mu[q], A @ S[q, q] @ A.T
    np.testing.assert_allclose(law.mean, P @ mean_pre + bp, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(law.cov, P @ cov_pre @ P.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(jacobian, P @ A @ W[q], rtol=1e-12, atol=1e-12)
    # A (mean, cov) pair works as the law, and the result unpacks.
    mean, cov = ex.attention_law((mean_h, cov_h), W, bq, P, bp, n_head)[0]
    np.testing.assert_array_equal(mean, law.mean)
    np.testing.assert_array_equal(cov, law.cov)
    with pytest.raises(ValueError, match="divisible"):
        ex.attention_law(law, W, bq, P, bp, 3)
    with pytest.raises(ValueError, match="qkv_weight"):
        ex.attention_law(law, W[:-1], bq, P, bp, n_head)
    with pytest.raises(TypeError):
        ex.attention_law("law", W, bq, P, bp, n_head)


def test_rope_matches_the_spec_vector():
    """E1-1: head_dim 4, x = [1, 2, 3, 4] at positions 1 and 2 (docs/mechanisms.md#streaming-language-model)."""
    cos, sin = ex.rope_tables([1, 2], 4)
    x = np.tile([1.0, 2.0, 3.0, 4.0], (2, 1, 1))  # (t, H, head_dim)
    out = ex.apply_rope(x, cos, sin)
    np.testing.assert_allclose(out[0, 0], [-1.9841, 1.9599, 2.4624, 4.0198], atol=1e-4)
    np.testing.assert_allclose(out[1, 0], [-3.1440, 1.9196, -0.3391, 4.0392], atol=1e-4)
    np.testing.assert_array_equal(ex.rotate_half(np.array([1.0, 2.0, 3.0, 4.0])), [-3.0, -4.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="even"):
        ex.rope_tables([0, 1], 3)
    with pytest.raises(ValueError, match="apply_rope"):
        ex.apply_rope(x[:1], cos, sin)


# ---- language models on token arrays -------------------------------------------------------------------------

TINY_MODEL = dict(vocab=8, d_model=16, n_layer=1, n_head=2, window=8, max_clusters=2)


def pattern_tokens(n=400):
    return np.tile(np.array([0, 1, 2, 3, 4, 5, 6, 7, 1, 3, 5, 7]), n // 12 + 1)[:n]


@pytest.mark.parametrize("mechanism", ["window", "full", "moment-closure"])
def test_train_and_evaluate_a_tiny_language_model(tmp_path, mechanism):
    """A periodic token array is learnt: the mean loss of the last 5 steps is well below that of the first 5; the
    checkpoint evaluates, describes itself and generates tokens of the vocabulary."""
    tokens = pattern_tokens()
    checkpoint = tmp_path / "model.ckpt"
    seen = []
    summary = ex.train_language_model(
        tokens[:360],
        heldout=tokens[360:],
        out=checkpoint,
        on_progress=seen.append,
        mechanism=mechanism,
        batch=2,
        chunk=8,
        steps=40,
        lr=1e-2,
        schedule="constant",
        **TINY_MODEL,
    )
    losses = summary["losses"]
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    assert (summary["first_step"], summary["steps"], summary["tokens"]) == (0, 40, 40 * 2 * 8)
    assert summary["parameters"] > 0 and summary["state_bytes"] > 0
    assert [p["step"] for p in seen] == list(range(1, 41)) and seen[-1]["loss"] == losses[-1]
    assert ("far_share" in seen[0]) == (mechanism == "moment-closure")
    assert not any("heldout_bits_per_byte" in p for p in seen)  # eval_every = 0: only the final model is scored
    assert len(summary["far_field"]) == (1 if mechanism == "moment-closure" else 0)
    assert summary["heldout"]["tokens"] > 0

    evaluation = ex.evaluate_language_model(checkpoint, tokens[360:], chunk=8)
    assert evaluation["mean_cross_entropy"] == pytest.approx(summary["heldout"]["mean_cross_entropy"], rel=1e-9)
    assert evaluation["bits_per_token"] == pytest.approx(evaluation["mean_cross_entropy"] / math.log(2), rel=1e-12)
    assert evaluation["mean_cross_entropy"] < math.log(8)

    info = ex.checkpoint_info(str(checkpoint))
    assert info["step"] == 40 and info["corpus_tokens"] == 360
    assert info["options"]["mechanism"] == mechanism and info["options"]["vocab"] == 8

    drawn = ex.generate_language_model(checkpoint, tokens[:5], tokens=12, seed=3)
    assert drawn.dtype == np.int64 and drawn.shape == (12,) and drawn.min() >= 0 and drawn.max() < 8

    # The window's cache held as int8 between chunks: nearly the same loss, fewer bytes.
    int8 = ex.evaluate_language_model(checkpoint, tokens[360:], chunk=8, window_cache="int8")
    assert int8["mean_cross_entropy"] == pytest.approx(evaluation["mean_cross_entropy"], rel=0.05)
    assert int8["state_bytes"] < evaluation["state_bytes"]
    again = ex.generate_language_model(checkpoint, tokens[:5], tokens=12, seed=3, window_cache="int8")
    assert again.shape == (12,) and again.max() < 8
    with pytest.raises(ValueError, match="window_cache"):
        ex.evaluate_language_model(checkpoint, tokens[360:], window_cache="int4")


def test_eval_every_reports_the_held_out_curve():
    """eval_every = K adds heldout_bits_per_byte to every K-th progress dict but the last; the score at step K is the
    final score of a run that stops there; the losses are those of a run that never scores; moment closure's dicts
    carry one clusters, bank_mass and far_share entry per layer."""
    tokens = pattern_tokens()
    options = dict(mechanism="moment-closure", batch=2, chunk=8, lr=1e-2, schedule="constant", **TINY_MODEL)
    seen = []
    scored = ex.train_language_model(tokens[:360], heldout=tokens[360:], on_progress=seen.append, steps=9,
                                     eval_every=3, **options)
    assert [p["step"] for p in seen if "heldout_bits_per_byte" in p] == [3, 6]
    assert all(len(p["clusters"]) == len(p["bank_mass"]) == len(p["far_share"]) == 1 for p in seen)
    plain = ex.train_language_model(tokens[:360], heldout=tokens[360:], steps=9, **options)
    assert scored["losses"] == plain["losses"]
    short = ex.train_language_model(tokens[:360], heldout=tokens[360:], steps=3, **options)
    assert seen[2]["heldout_bits_per_byte"] == short["heldout"]["bits_per_token"]
    with pytest.raises(ValueError, match="eval_every"):
        ex.train_language_model(tokens[:360], heldout=tokens[360:], steps=2, eval_every=-1, **options)


def test_a_callback_error_stops_training(tmp_path):
    """An exception raised by on_progress propagates unchanged, and the run writes no checkpoint."""
    checkpoint = tmp_path / "model.ckpt"

    def stop(progress):
        if progress["step"] == 3:
            raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        ex.train_language_model(
            pattern_tokens(), out=checkpoint, on_progress=stop, batch=2, chunk=8, steps=10, **TINY_MODEL
        )
    assert not checkpoint.exists()


def test_language_model_options_come_from_cpp():
    defaults = ex.default_train_options()
    assert defaults["mechanism"] == "window" and defaults["schedule"] == "cosine"
    assert defaults["merge_threshold"] is None
    assert {"vocab", "d_model", "batch", "chunk", "steps", "lr", "seed", "threads"} <= set(defaults)
    assert ex.default_generate_options()["tokens"] > 0
    assert {"keys", "gap", "window", "steps", "eval_sequences"} <= set(ex.default_recall_options())
    np.testing.assert_array_equal(ex.byte_tokens("ab"), [97, 98])


def test_every_option_is_documented_with_its_defaults():
    """The docstring of each default_*_options() lists every keyword the dict holds, with what it means."""
    for defaults in (ex.default_train_options, ex.default_generate_options, ex.default_recall_options,
                     ex.default_memory_bench_options):
        for key in defaults():
            assert f"``{key}``: " in defaults.__doc__, (defaults.__name__, key)


# Every option a checkpoint stores, each set to a value other than its default.
STORED_OPTIONS = dict(vocab=8, d_model=8, n_layer=1, n_head=2, window=8, batch=2, chunk=8, steps=2, detach_horizon=2,
                      lr=0.02, min_lr_ratio=0.2, schedule="constant", weight_decay=0.05, clip=0.5, seed=7)
MECHANISM_OPTIONS = {
    "moment-closure": dict(max_clusters=3, birth_threshold=-1.5, merge_threshold=2.5, outlier_capacity=2,
                           cluster_rule="budget"),
    "frequent-directions": dict(sketch_rows=8),
    "tensor-sketch": dict(sketch_dim=16, sketch_degree=3),
}


@pytest.mark.parametrize("mechanism", ["window", "moment-closure", "frequent-directions", "tensor-sketch"])
def test_a_checkpoint_keeps_the_options_of_its_mechanism(tmp_path, mechanism):
    """checkpoint_info gives back every stored option as given; another mechanism's options, and those a checkpoint
    does not store (threads, checkpoint_every, eval_every), keep their defaults."""
    checkpoint = tmp_path / "m.ckpt"
    other = {k: v for options in MECHANISM_OPTIONS.values() for k, v in options.items()}
    ex.train_language_model(pattern_tokens(), out=str(checkpoint), mechanism=mechanism, threads=1, checkpoint_every=1,
                            **STORED_OPTIONS, **other)
    expected = dict(ex.default_train_options(), mechanism=mechanism, **STORED_OPTIONS,
                    **MECHANISM_OPTIONS.get(mechanism, {}))
    assert ex.checkpoint_info(str(checkpoint))["options"] == expected


def test_language_model_errors(tmp_path):
    tokens = pattern_tokens(100)
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
        ex.train_language_model(tokens, no_such_option=1)
    with pytest.raises(ValueError, match="mechanism"):
        ex.train_language_model(tokens, mechanism="transformer")
    with pytest.raises(ValueError):
        ex.train_language_model(tokens, vocab=4, batch=1, chunk=8, steps=1)  # ids ≥ vocab
    with pytest.raises(ValueError):
        ex.train_language_model(tokens, steps=0)
    with pytest.raises(TypeError):
        ex.train_language_model(tokens, steps=1.5)
    with pytest.raises(TypeError):
        ex.train_language_model(tokens > 3)  # bool ids
    with pytest.raises(FileNotFoundError, match="missing.ckpt: cannot open the checkpoint"):
        ex.evaluate_language_model(tmp_path / "missing.ckpt", tokens)
    with pytest.raises(IsADirectoryError, match="cannot open the checkpoint"):
        ex.evaluate_language_model(tmp_path, tokens)
    with pytest.raises(FileNotFoundError, match="cannot open the checkpoint"):
        ex.checkpoint_info(tmp_path / "missing.ckpt")
    for call in (lambda p: ex.evaluate_language_model(p, tokens), ex.checkpoint_info,
                 lambda p: ex.generate_language_model(p, [1, 2]),
                 lambda p: ex.train_language_model(tokens, steps=1, out=p)):
        with pytest.raises(ValueError, match="contains a NUL byte"):
            call(str(tmp_path / "m.ckpt") + "\0junk")
    assert not os.listdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no_such_dir"):  # the checkpoint cannot be written
        ex.train_language_model(pattern_tokens(), out=tmp_path / "no_such_dir" / "m.ckpt", batch=2, chunk=8,
                                steps=1, **TINY_MODEL)
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        ex.train_language_model(pattern_tokens(), resume_from=tmp_path / "missing.ckpt", batch=2, chunk=8,
                                steps=1, **TINY_MODEL)


def test_run_recall_returns_a_sane_result():
    steps = []
    result = ex.run_recall(
        "moment-closure",
        on_step=lambda step, loss: steps.append((step, loss)),
        d_model=16,
        n_layer=1,
        window=8,
        chunk=8,
        gap=8,
        batch=4,
        steps=3,
        eval_sequences=8,
    )
    keys = {"mechanism", "accuracy", "cross_entropy", "first_loss", "last_loss", "state_bytes", "seconds"}
    assert set(result) == keys
    assert result["mechanism"] == "moment-closure"
    assert 0.0 <= result["accuracy"] <= 1.0
    assert all(math.isfinite(result[key]) for key in ("cross_entropy", "first_loss", "last_loss"))
    assert result["state_bytes"] > 0
    assert len(steps) == 3 and all(math.isfinite(loss) for _, loss in steps)
    with pytest.raises(ValueError):
        ex.run_recall("attention", steps=1)


def test_run_recall_trains_linear_attention():
    result = ex.run_recall("linear", d_model=16, n_layer=1, chunk=8, gap=8, batch=4, steps=2, eval_sequences=8)
    assert result["mechanism"] == "linear"
    # one layer, 2 heads of 8: S (2 x 8 x 8) and Z (2 x 8) in float64, the shift row (16) in float32
    assert result["state_bytes"] == (2 * 8 * 8 + 2 * 8) * 8 + 16 * 4


def test_run_recall_trains_frequent_directions():
    kwargs = dict(d_model=16, n_layer=1, chunk=8, gap=8, batch=4, steps=2, eval_sequences=8, window=4)
    result = ex.run_recall("frequent-directions", sketch_rows=6, **kwargs)
    assert result["mechanism"] == "frequent-directions"
    # one layer, 2 heads of 8: window 4 x (8 + 8) float32, sketch 6 x 16, Z 8, mass, shrink total float64, the
    # shift row (16) in float32
    assert result["state_bytes"] == 2 * (4 * 16 * 4 + (6 * 16 + 8 + 2) * 8) + 16 * 4
    assert ex.default_recall_options()["sketch_rows"] == 16
    with pytest.raises(ValueError, match="sketch_rows"):
        ex.run_recall("frequent-directions", sketch_rows=5, **kwargs)


def test_run_recall_trains_tensor_sketch():
    kwargs = dict(d_model=16, n_layer=1, chunk=8, gap=8, batch=4, steps=2, eval_sequences=8, window=4)
    result = ex.run_recall("tensor-sketch", sketch_dim=12, sketch_degree=2, **kwargs)
    assert result["mechanism"] == "tensor-sketch"
    # one layer, 2 heads of 8: window 4 x (8 + 8) float32, S 12 x 8, Z 12, misfit float64, the shift row (16)
    assert result["state_bytes"] == 2 * (4 * 16 * 4 + (12 * 8 + 12 + 1) * 8) + 16 * 4
    assert ex.default_recall_options()["sketch_dim"] == 64
    with pytest.raises(ValueError, match="sketch_degree"):
        ex.run_recall("tensor-sketch", sketch_degree=0, **kwargs)


def test_train_frequent_directions_records_its_sketch(tmp_path):
    tokens = np.frombuffer(b"the quick brown fox jumps over the lazy dog " * 20, dtype=np.uint8).astype(np.int64)
    out = tmp_path / "fd.ckpt"
    summary = ex.train_language_model(tokens, mechanism="frequent-directions", d_model=8, n_layer=1, window=4,
                                      sketch_rows=4, batch=2, chunk=8, steps=3, out=str(out))
    assert len(summary["losses"]) == 3 and all(math.isfinite(x) for x in summary["losses"])
    assert out.exists()
    with pytest.raises(ValueError, match="sketch_rows"):
        ex.train_language_model(tokens, mechanism="frequent-directions", sketch_rows=3, steps=1)


def test_run_recall_trains_moment_closure_with_outliers():
    kwargs = dict(d_model=16, n_layer=1, chunk=8, gap=8, batch=4, steps=2, eval_sequences=8, max_clusters=2)
    plain = ex.run_recall("moment-closure", **kwargs)
    kept = ex.run_recall("moment-closure+outliers", outlier_capacity=3, **kwargs)
    assert kept["mechanism"] == "moment-closure+outliers"
    # one layer, 2 clusters x 3 slots of int8 k and v (2 heads x 8) with two float32 scales per row
    assert kept["state_bytes"] - plain["state_bytes"] == 2 * (2 * 3 * 2 * 8 + 2 * 2 * 3 * 2 * 4)
    assert ex.default_recall_options()["outlier_capacity"] == 8
    with pytest.raises(ValueError, match="outlier_capacity"):
        ex.run_recall("moment-closure+outliers", outlier_capacity=0, **kwargs)
    with pytest.raises(ValueError, match="moment-closure\\+outliers"):
        ex.run_recall("moment-closure+extras", **kwargs)


def test_ingestion_receipts_report_outlier_residuals(rng):
    bank = ex.empty_cluster_bank(batch_size=1, n_head=2, max_clusters=2, head_dim=4)
    k, v = rng.standard_normal((1, 12, 2, 4)), rng.standard_normal((1, 12, 2, 4))
    _, receipts = ex.ingest_cluster_batch(bank, k, v, birth_threshold=-2.0, outlier_top_k=3)
    for outliers in receipts[0]["per_cluster_outlier_tokens"].values():
        residuals = outliers["residuals"]
        assert len(residuals) == len(outliers["indices"]) <= 3
        assert residuals == sorted(residuals, reverse=True) and min(residuals) >= 0.0


def test_run_memory_benchmark_reports_every_case():
    seen = []
    report = ex.run_memory_benchmark(
        on_run=lambda *run: seen.append(run),
        mechanisms=["window", "linear", "full"],
        tasks=["recall", "mqar"],
        recall_gaps=[12],
        recall_pairs=[1, 2],
        mqar_lengths=[16],
        mqar_pairs=2,
        seeds=[3, 4],
        d_model=8,
        n_layer=1,
        chunk=8,
        batch=2,
        steps=1,
        eval_sequences=4,
    )
    assert len(report["runs"]) == 3 * 3 * 2 and len(seen) == 18
    assert seen[0] == (1, 18, "recall", "gap 12, pairs 1", "window", 3)
    assert seen[-1] == (18, 18, "mqar", "length 16, pairs 2", "full", 4)
    assert [c["mechanism"] for c in report["cases"][:3]] == ["window", "linear", "full"]
    for case in report["cases"]:
        assert case["seeds"] == 2
        assert case["accuracy_min"] <= case["accuracy"] <= case["accuracy_max"]
        runs = [r for r in report["runs"] if (r["task"], r["setting"], r["mechanism"]) ==
                (case["task"], case["setting"], case["mechanism"])]
        assert case["accuracy"] == pytest.approx(sum(r["accuracy"] for r in runs) / 2)
        share = case["share_of_full_gain"]
        assert share is None or (case["mechanism"] != "full" or share == pytest.approx(1.0))
    defaults = ex.default_memory_bench_options()
    assert defaults["recall_gaps"] == [24, 64, 256, 1024] and defaults["mechanisms"][2:4] == ["moment-closure+outliers", "linear"]
    with pytest.raises(ValueError, match="unknown task"):
        ex.run_memory_benchmark(tasks=["sorting"])
    with pytest.raises(TypeError, match="must be a list"):
        ex.run_memory_benchmark(seeds=3)
    with pytest.raises(ValueError, match="mqar: length"):
        ex.run_memory_benchmark(tasks=["mqar"], mqar_lengths=[30], mqar_pairs=16)
