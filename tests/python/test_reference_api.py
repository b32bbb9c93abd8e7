# SPDX-License-Identifier: Apache-2.0
"""Code written for the reference design (mixle) runs on attnmix with its imports renamed: each test below is written
the way the reference's documentation and seeds use the API — its module paths, seq_encode and
seq_log_density_sum, accumulator statistics read as attributes, value() ending with a JSON-serialisable optimizer
state, attention_law's keywords and one-stream cluster banks — and checks the results against an independent
computation (per-row densities, value() itself, the explicit form of the same call)."""
import json
import math

import numpy as np
import pytest

import attnmix


def test_the_reference_module_paths_hold_the_same_objects():
    from attnmix.experimental.context_spine import SlidingWindowSpine, SlidingWindowState
    from attnmix.experimental.moment_closure_attention import MomentClosureAttention, ingest_cluster_batch
    from attnmix.inference import optimize
    from attnmix.models.moment_propagation import attention_law
    from attnmix.stats import CategoricalDistribution, MixtureDistribution
    from attnmix.stats.latent.chained_attention import ChainedAttentionEstimator
    from attnmix.stats.latent.responsibility_attention import (
        ResponsibilityAttentionDistribution,
        sequence_to_triples,
    )
    from attnmix.stats.latent.variational_embedding_attention import VariationalEmbeddingAttentionEstimator
    from attnmix.stats.latent.variational_multihop_attention import VariationalMultiHopAttentionEstimator
    from attnmix.utils.vector import ImpossibleEvidenceError

    import attnmix.experimental as ex
    import attnmix.torch as at

    assert optimize is attnmix.optimize and ImpossibleEvidenceError is attnmix.ImpossibleEvidenceError
    assert MixtureDistribution is attnmix.MixtureDistribution
    assert CategoricalDistribution is attnmix.CategoricalDistribution
    assert ResponsibilityAttentionDistribution is attnmix.ResponsibilityAttentionDistribution
    assert sequence_to_triples is attnmix.sequence_to_triples
    assert ChainedAttentionEstimator is attnmix.ChainedAttentionEstimator
    assert VariationalEmbeddingAttentionEstimator is attnmix.VariationalEmbeddingAttentionEstimator
    assert VariationalMultiHopAttentionEstimator is attnmix.VariationalMultiHopAttentionEstimator
    assert attention_law is ex.attention_law
    assert MomentClosureAttention is at.MomentClosureAttention and ingest_cluster_batch is at.ingest_cluster_batch
    assert SlidingWindowSpine is at.SlidingWindowSpine and SlidingWindowState is at.SlidingWindowState


def recall_rows(seed, n=60):
    """Rows drawn from a small responsibility-attention head."""
    from attnmix.stats.latent.responsibility_attention import ResponsibilityAttentionDistribution

    rng = np.random.default_rng(seed)
    emission = rng.random((4, 3)) + 0.1
    head = ResponsibilityAttentionDistribution(rng.normal(size=(4, 2)), emission / emission.sum(1, keepdims=True),
                                               np.full(3, 1 / 3), sigma2=0.7)
    return head, head.sampler(seed=seed).sample(n)


def test_a_responsibility_head_inside_a_mixture_scores_its_chunks():
    """The reference's headline composition: a responsibility head inside a mixture, data encoded in chunks with
    seq_encode (the model standing in the encoder slot) and scored with seq_log_density_sum."""
    from attnmix.inference import optimize
    from attnmix.stats import MixtureDistribution, MixtureEstimator, seq_encode, seq_log_density, seq_log_density_sum
    from attnmix.stats.latent.responsibility_attention import ResponsibilityAttentionEstimator

    head, data = recall_rows(3)
    other, _ = recall_rows(4)
    mixture = MixtureDistribution([head, other], [0.3, 0.7])
    enc_data = seq_encode(data, mixture, num_chunks=3)
    assert [count for count, _ in enc_data] == [20, 20, 20]
    # Row i goes to chunk i mod 3.
    np.testing.assert_array_equal(seq_log_density(enc_data, mixture)[1],
                                  [mixture.log_density(x) for x in data[1::3]])
    count, total = seq_log_density_sum(enc_data, mixture)
    assert count == len(data)
    assert total == pytest.approx(sum(mixture.log_density(x) for x in data), rel=1e-12)

    estimator = MixtureEstimator([ResponsibilityAttentionEstimator(4, 3, 2, 3)] * 2)
    by_estimator = seq_encode(data, estimator=estimator, chunk_size=25)
    assert [n for n, _ in by_estimator] == [20, 20, 20]  # ceil(60 / 25) = 3 chunks
    fit = optimize(data, estimator, max_its=5, rng=np.random.RandomState(1))
    assert seq_log_density_sum(seq_encode(data, fit), fit)[1] == pytest.approx(
        sum(fit.log_density(x) for x in data), rel=1e-12)
    with pytest.raises(TypeError, match="exactly one of encoder, estimator or model"):
        seq_encode(data, mixture, model=mixture)
    with pytest.raises(ValueError, match="num_chunks"):
        seq_encode(data, mixture, num_chunks=0)


def test_accumulator_statistics_are_attributes():
    """Reference code reads accumulator statistics by name (accumulator.ll, acc.key_sum): copies of value()'s."""
    from attnmix.stats.latent.chained_attention import ChainedAttentionEstimator
    from attnmix.stats.latent.responsibility_attention import ResponsibilityAttentionAccumulator

    head, data = recall_rows(5, n=30)
    acc = ResponsibilityAttentionAccumulator(4, 3, 2, 3)
    acc.seq_update(head.dist_to_encoder().seq_encode(data), np.ones(30), head)
    key_sum, key_mass, emission_count, position_count, query_sq = acc.value()
    np.testing.assert_array_equal(acc.key_sum, key_sum)
    np.testing.assert_array_equal(acc.key_mass, key_mass)
    np.testing.assert_array_equal(acc.emission_count, emission_count)
    np.testing.assert_array_equal(acc.position_count, position_count)
    assert acc.query_sq == query_sq and position_count.sum() == pytest.approx(30.0)
    acc.key_sum[0, 0] += 1.0  # a copy: the accumulator is unchanged
    np.testing.assert_array_equal(acc.key_sum, key_sum)
    with pytest.raises(AttributeError):
        acc.key_sum = key_sum

    rng = np.random.default_rng(6)
    model = ChainedAttentionEstimator(2, 6, 6).accumulator_factory().make()
    rows = [(list(rng.permutation(6)[:4]), list(rng.integers(0, 6, 4)), int(rng.integers(6)), int(rng.integers(6)))
            for _ in range(12)]
    from attnmix import ChainedAttentionDistribution

    keys = rng.normal(size=(2, 6, 6))
    emission = np.full((6, 6), 1 / 6)
    dist = ChainedAttentionDistribution(keys, emission)
    model.seq_update(dist.dist_to_encoder().seq_encode(rows), np.ones(12), dist)
    assert model.ll == pytest.approx(sum(dist.log_density(x) for x in rows), rel=1e-12)
    assert model.n == 12.0
    assert model.key_num.shape == (2, 6, 6) and model.key_mass.shape == (2, 6)


def test_variational_value_ends_with_a_json_serialisable_state():
    """The reference's value() ends with the optimizer state's to_dict(), which callers json.dumps; from_value and
    combine take it back, and the object form is one from_dict away."""
    from attnmix.stats.latent.variational_embedding_attention import (
        AttentionOptimizerState,
        VariationalEmbeddingAttentionEstimator,
    )

    rng = np.random.default_rng(7)
    rows = [(list(rng.integers(0, 6, 3)), int(rng.integers(6)), int(rng.integers(3))) for _ in range(20)]
    estimator = VariationalEmbeddingAttentionEstimator(6, 3, 2, 3, seed=4)
    model = attnmix.optimize(rows, estimator, max_its=2, rng=np.random.RandomState(2))
    acc = estimator.accumulator_factory().make()
    acc.seq_update(model.dist_to_encoder().seq_encode(rows), np.ones(20), model)
    value = acc.value()
    state = value[-1]
    assert isinstance(state, dict) and json.loads(json.dumps(state)) == state
    assert AttentionOptimizerState.from_dict(state) == model.optimizer_state
    again = estimator.accumulator_factory().make().from_value(value)
    assert again.value()[-1] == state
    again.combine(value)
    assert again.n == 2 * acc.n
    assert estimator.estimate(None, value).optimizer_state.iteration == model.optimizer_state.iteration + 1
    # The object form is accepted too.
    assert estimator.accumulator_factory().make().from_value(value[:-1] + (model.optimizer_state,)).value()[-1] == state


def test_attention_law_takes_the_reference_keywords():
    """GaussianLaw(mu=..., covar=...) and proj_bias=None (no bias) give what mean/cov and a zero bias give."""
    from attnmix.models.moment_propagation import GaussianLaw, attention_law

    rng = np.random.default_rng(8)
    d = 4
    mu, root = rng.normal(size=d), rng.normal(size=(d, d))
    covar = root @ root.T + np.eye(d)
    qkv_w, qkv_b, proj_w = rng.normal(size=(3 * d, d)), rng.normal(size=3 * d), rng.normal(size=(d, d))
    law = GaussianLaw(mu=mu, covar=covar)
    np.testing.assert_array_equal(law.mu, mu)
    np.testing.assert_array_equal(law.covar, covar)
    out, jacobian = attention_law(law, qkv_w, qkv_b, proj_w, proj_bias=None, n_head=2)
    expected, expected_jacobian = attention_law(GaussianLaw(mean=mu, cov=covar), qkv_w, qkv_b, proj_w, np.zeros(d), 2)
    np.testing.assert_array_equal(out.mean, expected.mean)
    np.testing.assert_array_equal(out.cov, expected.cov)
    np.testing.assert_array_equal(jacobian, expected_jacobian)
    with pytest.raises(TypeError, match="exactly one of mean or mu"):
        GaussianLaw(mean=mu, mu=mu, cov=covar)


def test_one_stream_cluster_banks_on_numpy():
    """The reference keeps one bank without a stream axis and gets one receipt back: empty_cluster_bank(H, C, d)
    works that way, and gives what a one-stream bank of attnmix's stream layout gives on the same tokens."""
    import attnmix.experimental as ex

    rng = np.random.default_rng(9)
    k, v = rng.normal(size=(2, 5, 2, 3)), rng.normal(size=(2, 5, 2, 3))
    bank = ex.empty_cluster_bank(2, 4, 3)
    assert isinstance(bank, ex.OneStreamClusterBank) and bank.count.shape == (2, 4) and bank.n_clusters == 0
    bank, receipt = ex.ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)
    assert isinstance(receipt, dict) and receipt["count_conserved"] and bank.n_clusters == 1
    np.testing.assert_allclose(bank.total_per_head(), [10.0, 10.0])

    streams = ex.empty_cluster_bank(1, 2, 4, 3)  # the explicit form: one stream of all ten tokens
    streams, receipts = ex.ingest_cluster_batch(streams, k.reshape(1, 10, 2, 3), v.reshape(1, 10, 2, 3),
                                                birth_threshold=-2.0)
    assert isinstance(receipts, list) and len(receipts) == 1
    for field in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk"):
        np.testing.assert_array_equal(getattr(bank, field), getattr(streams, field)[0])
    q = rng.normal(size=(2, 3, 2, 3))
    out, logits = ex.mgf_cluster_attention(q, bank)
    expected_out, expected_logits = ex.mgf_cluster_attention(q.reshape(1, 6, 2, 3), streams)
    assert out.shape == (2, 3, 1, 2, 3)
    np.testing.assert_array_equal(out.reshape(1, 6, 1, 2, 3), expected_out)
    np.testing.assert_array_equal(logits.reshape(1, 6, 1, 2), expected_logits)
    assert math.isfinite(float(logits.sum()))
    with pytest.raises(TypeError, match="n_clusters must be an int"):
        ex.OneStreamClusterBank(bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk, [1])
