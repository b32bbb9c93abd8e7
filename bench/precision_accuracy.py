#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""How far the mixed-precision E-steps of responsibility and variational embedding attention land from float64
(docs/mixed_precision.md).

For each problem, two fits from the same initialisation (same rng seed), one with precision="float64" and one with
precision="mixed", and one E-step of both precisions on the same model; prints, as JSON:
  one_e_step      |log-likelihood difference| per row and relative to the total, on the problem's own model
  fit             log-likelihood per row of each fit, their difference, and the largest absolute differences of the
                  fitted parameters (key_means, emission, position_prior, and sigma2 where it is learned; for the
                  variational family mean, log_var, emission, position_prior)
  accuracy        test accuracy of each fit where the problem has a test set (the thresholds of the acceptance tasks)

Problems: responsibility attention's benchmark workload (bench/numpy_ra_em.py's generator, 200000 rows, 10
iterations) and acceptance tasks RA-5 (recall, 40 iterations), RA-9 (sigma2 learned, 40) and RA-12 (Markov text,
40) with the data generators of tests/python/helpers.py and tests/python/test_acceptance.py's settings; variational
embedding attention's benchmark workload (bench/numpy_variational_em.py's generator, 20000 rows, 10 iterations) and
the synonym task of VEA-2 (tests/python/test_variational_acceptance.py: 1500 / 1000 rows, 250 iterations).

Usage: /usr/bin/python3 bench/precision_accuracy.py [--rows 200000]   (PYTHONPATH=build/python)
"""
import argparse
import io
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))

import attnmix  # noqa: E402
from attnmix import (  # noqa: E402
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    VariationalEmbeddingAttentionDistribution,
    VariationalEmbeddingAttentionEstimator,
    optimize,
)
from helpers import D, N, S, T, accuracy, markov_text, recall_task  # noqa: E402

import numpy_ra_em  # noqa: E402
import numpy_variational_em  # noqa: E402
import test_variational_acceptance as synonyms  # noqa: E402

PRECISIONS = ("float64", "mixed")


def in_precision(model, precision):
    """The same parameters in the given precision."""
    if isinstance(model, VariationalEmbeddingAttentionDistribution):
        return VariationalEmbeddingAttentionDistribution(model.mean, model.log_var, model.emission,
                                                         model.position_prior, model.sigma2, model.name,
                                                         model.optimizer_state, precision=precision)
    return ResponsibilityAttentionDistribution(model.key_means, model.emission, model.position_prior, model.sigma2,
                                               precision=precision)


def compared_parameters(model):
    if isinstance(model, VariationalEmbeddingAttentionDistribution):
        return ("mean", "log_var", "emission", "position_prior")
    return ("key_means", "emission", "position_prior")


def one_e_step(model, data):
    """log-likelihood of `data` under `model` in both precisions."""
    totals = {}
    for precision in PRECISIONS:
        m = in_precision(model, precision)
        totals[precision] = float(np.sum(m.seq_log_density(m.dist_to_encoder().seq_encode(data))))
    rows = len(data[2])
    diff = abs(totals["mixed"] - totals["float64"])
    return {"log_likelihood_per_row": totals["float64"] / rows, "abs_difference_per_row": diff / rows,
            "relative_difference": diff / abs(totals["float64"])}


def fits(data, make_estimator, max_its, seed, test=None):
    """Both precisions' fits from the same initialisation, and how far apart they are."""
    models = {p: optimize(data, make_estimator(p), max_its=max_its, delta=None, rng=seed, out=io.StringIO())
              for p in PRECISIONS}
    rows = len(data[2])
    ll = {p: float(np.sum(m.seq_log_density(m.dist_to_encoder().seq_encode(data)))) / rows for p, m in models.items()}
    out = {"log_likelihood_per_row": ll, "abs_difference_per_row": abs(ll["mixed"] - ll["float64"]),
           "max_abs_difference": {name: float(np.max(np.abs(getattr(models["mixed"], name) -
                                                              getattr(models["float64"], name))))
                                  for name in compared_parameters(models["float64"])},
           "sigma2": {p: m.sigma2 for p, m in models.items()}}
    if test is not None:
        out["accuracy"] = {p: accuracy(m.predict_proba(test[0], test[1]), test[2]) for p, m in models.items()}
    return out, models["float64"]


def benchmark_workload(rows):
    (K, B, pi), data = numpy_ra_em.make_problem(rows)
    truth = ResponsibilityAttentionDistribution(K, B, pi, numpy_ra_em.SIGMA2)
    fit, _ = fits(data, lambda p: ResponsibilityAttentionEstimator(numpy_ra_em.S, numpy_ra_em.N, numpy_ra_em.D,
                                                                   numpy_ra_em.T, sigma2=numpy_ra_em.SIGMA2,
                                                                   precision=p), 10, 1)
    return {"one_e_step": one_e_step(truth, data), "fit": fit}


def recall(rng):
    train, f = recall_task(4000, rng)
    test, _ = recall_task(1500, rng, f=f)
    fit, model = fits(train, lambda p: ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5, precision=p), 40, 2,
                      test)
    return {"one_e_step": one_e_step(model, train), "fit": fit}


def learned_sigma2(rng):
    truth = ResponsibilityAttentionDistribution(2.0 * rng.standard_normal((S, D)), np.eye(S), np.full(N, 1.0 / N),
                                                sigma2=0.7)
    batch = truth.sampler(seed=int(rng.integers(2**31))).sample(6000)
    data = (np.array([c for c, _, _ in batch]), np.array([y for _, y, _ in batch]), np.array([t for _, _, t in batch]))
    fit, model = fits(data, lambda p: ResponsibilityAttentionEstimator(S, N, D, S, sigma2=1.0, estimate_sigma2=True,
                                                                       precision=p), 40, 4)
    return {"one_e_step": one_e_step(model, data), "fit": fit}


def markov_problem(rng):
    V, context = 8, 4
    _, generate = markov_text(rng, V)
    def arrays(triples):
        return (np.array([c for c, _, _ in triples]), np.array([q for _, q, _ in triples]),
                np.array([t for _, _, t in triples]))

    train = arrays(attnmix.sequence_to_triples(generate(6000 + context), context, num_symbols=V))
    test = arrays(attnmix.sequence_to_triples(generate(4000 + context), context, num_symbols=V))
    fit, model = fits(train, lambda p: ResponsibilityAttentionEstimator(V, context, V, V, sigma2=0.3, precision=p),
                      40, 5, test)
    return {"one_e_step": one_e_step(model, train), "fit": fit}


def variational_workload(rows):
    v = numpy_variational_em
    model, c, q, t, _ = v.make_problem(rows)
    truth = VariationalEmbeddingAttentionDistribution(model["mean"], model["log_var"], model["emission"],
                                                      model["prior"], model["sigma2"])
    fit, _ = fits((c, q, t), lambda p: VariationalEmbeddingAttentionEstimator(v.S, v.N, v.D, v.T, sigma2=v.SIGMA2,
                                                                              lr=v.LR, mc=v.MC, precision=p), 10, 1)
    return {"one_e_step": one_e_step(truth, (c, q, t)), "fit": fit}


def synonym_problem(rng):
    rs = np.random.RandomState(int(rng.integers(2**31)))
    f_map = rs.permutation(synonyms.C)
    train = synonyms.synonym_task(1500, rs, f_map, [0])
    test = synonyms.synonym_task(1000, rs, f_map, [1])
    fit, model = fits(train, synonyms.vea_estimator, 250, 6, test)
    return {"one_e_step": one_e_step(model, train), "fit": fit}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200000)
    parser.add_argument("--variational-rows", type=int, default=20000)
    args = parser.parse_args()
    rng = np.random.default_rng(20240611)
    print(json.dumps({"benchmark_workload": benchmark_workload(args.rows), "RA-5 recall": recall(rng),
                      "RA-9 learned sigma2": learned_sigma2(rng), "RA-12 Markov text": markov_problem(rng),
                      "variational benchmark workload": variational_workload(args.variational_rows),
                      "VEA-2 synonyms": synonym_problem(rng)}, indent=1))


if __name__ == "__main__":
    main()
