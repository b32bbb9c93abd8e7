# SPDX-License-Identifier: Apache-2.0
"""An EM-fitted responsibility-attention head on top of a torch encoder, trained by alternation.

The content-recall task: each row has a context of N distinct symbols out of S, one position z of it is attended
(uniformly), and the target is f(c_z) for a fixed permutation f of the symbols. A model sees the context ids and a
real input vector x that identifies the attended symbol, but only through a distortion: the symbol's one-hot code
plus noise is concatenated with high-variance nuisance coordinates and mixed by a fixed random matrix, so neither
the raw inputs nor Euclidean distances between them are good attention queries.

Three models are fitted on the same training rows and scored on held-out rows (accuracy of the argmax target):

(a) head on raw inputs: a responsibility-attention head fitted by EM (``attnmix.optimize``) with x as its queries;
(b) encoder + softmax: a small torch encoder of x (by default a linear map to 16 dimensions, which suits the linear
    distortion; ``--hidden 32`` makes it a tanh MLP) followed by a linear softmax classifier over the targets,
    trained with Adam on the cross-entropy (it sees x, not the context);
(c) alternation: the same encoder produces the head's queries; repeat {EM refit of the head (key means, emission,
    position prior) on the encoder's current queries, warm-started from the previous head; Adam steps of the encoder
    and of the head's key means (a torch Parameter passed as ``key_means``) through the head}, then a last EM refit.

For reference the example also prints two lines that are not part of the comparison: (a*) the head on raw inputs
with its keys at the true class means of the inputs (it uses the hidden attended symbols), which shows how far an
isotropic head on the raw inputs gets even without EM's local optima; and (b+) the classifier of (b) that also sees
the context as a multi-hot vector added to its logits (a discriminative model given the same information as (c)).

The encoder's loss in (c) is the conditional log-likelihood of the target, written with the head's log density:
log p(t | c, y) = log p(y, t | c) - log sum_t' p(y, t' | c), both terms from ``responsibility_log_density``. (The
generative log density log p(y, t | c) on its own is not a usable encoder loss: it only asks every query to lie
close to its key, which shrinking all queries towards one point achieves.)

Run ``python3 examples/torch_em_encoder.py`` (about 15 s of CPU time, one thread); ``--help`` lists the settings.
It exits with status 1 if (c) does not beat both (a) and (b).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import attnmix

try:
    from attnmix.torch.em_heads import responsibility_log_density
except ImportError:  # an attnmix build without its compiled torch extension: load the pure-Python module alone
    import importlib.util
    import pathlib

    _path = pathlib.Path(attnmix.__file__).parent / "torch" / "em_heads.py"
    _spec = importlib.util.spec_from_file_location("attnmix_torch_em_heads", _path)
    _em_heads = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_em_heads)
    responsibility_log_density = _em_heads.responsibility_log_density


# ---- data -------------------------------------------------------------------------------------------------------


def make_task(n_train, n_test, seed, *, n_symbols=16, context_length=6, input_dim=32, n_nuisance=16, noise=0.3,
              nuisance_scale=1.0):
    """Training and test rows and the map f.

    Each set of rows is (contexts (n, N) int64, inputs (n, input_dim) float64, targets (n,) int64, attended symbols
    (n,)); the attended symbols are hidden from the models.
    """
    S, N = n_symbols, context_length
    rng = np.random.default_rng(seed)
    target_of_symbol = rng.permutation(S)
    mixing = rng.standard_normal((input_dim, S + n_nuisance)) / np.sqrt(S + n_nuisance)

    def rows(n):
        contexts = np.stack([rng.choice(S, size=N, replace=False) for _ in range(n)])
        z = rng.integers(0, N, size=n)
        symbols = contexts[np.arange(n), z]
        code = np.eye(S)[symbols] + noise * rng.standard_normal((n, S))
        nuisance = nuisance_scale * rng.standard_normal((n, n_nuisance))
        inputs = np.concatenate([code, nuisance], axis=1) @ mixing.T
        return contexts.astype(np.int64), inputs, target_of_symbol[symbols].astype(np.int64), symbols

    return rows(n_train), rows(n_test), target_of_symbol


def accuracy(proba, targets):
    return float(np.mean(np.argmax(np.asarray(proba), axis=1) == targets))


def make_encoder(input_dim, query_dim, hidden, seed):
    """A linear map (hidden = 0) or a one-hidden-layer tanh MLP from inputs to queries, in float64."""
    torch.manual_seed(seed)
    if hidden == 0:
        return torch.nn.Linear(input_dim, query_dim).double()
    return torch.nn.Sequential(torch.nn.Linear(input_dim, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, query_dim)).double()


# ---- (a) the head on raw inputs ---------------------------------------------------------------------------------


def fit_head(contexts, queries, targets, n_symbols, *, sigma2, estimate_sigma2, max_its, seed, prev=None):
    estimator = attnmix.ResponsibilityAttentionEstimator(
        n_symbols, contexts.shape[1], queries.shape[1], n_symbols, sigma2=sigma2, estimate_sigma2=estimate_sigma2)
    return attnmix.optimize((contexts, queries, targets), estimator, max_its=max_its, rng=seed, prev_estimate=prev,
                            out=None)


# ---- (b) encoder + softmax classifier ---------------------------------------------------------------------------


class Classifier(torch.nn.Module):
    """logits = W encoder(x) + b, plus V multi_hot(context) when the context is used."""

    def __init__(self, input_dim, n_symbols, *, query_dim, hidden, use_context, seed):
        super().__init__()
        self.encoder = make_encoder(input_dim, query_dim, hidden, seed)
        self.classifier = torch.nn.Linear(query_dim, n_symbols).double()
        self.context = torch.nn.Linear(n_symbols, n_symbols, bias=False).double() if use_context else None
        self.n_symbols = n_symbols

    def forward(self, contexts, x):
        logits = self.classifier(self.encoder(x))
        if self.context is not None:
            multi_hot = torch.zeros(x.shape[0], self.n_symbols, dtype=x.dtype)
            multi_hot.scatter_(1, torch.from_numpy(contexts), 1.0)
            logits = logits + self.context(multi_hot)
        return logits


def train_classifier(train, n_symbols, *, query_dim, hidden, epochs, lr, seed, use_context=False):
    contexts, x, t = train
    model = Classifier(x.shape[1], n_symbols, query_dim=query_dim, hidden=hidden, use_context=use_context, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    x_t, t_t = torch.from_numpy(x), torch.from_numpy(t)
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(contexts, x_t), t_t)
        loss.backward()
        optimizer.step()
    return model


# ---- (c) alternation --------------------------------------------------------------------------------------------


def conditional_log_likelihood(head, contexts, queries, targets, key_means=None):
    """log p(t | c, y) per row = log p(y, t | c) - logsumexp_t' log p(y, t' | c), via the differentiable head."""
    n, T = queries.shape[0], head.num_targets
    log_joint = responsibility_log_density(head, contexts, queries, targets, key_means=key_means)
    every_target = np.tile(np.arange(T, dtype=np.int64), n)
    log_all = responsibility_log_density(head, np.repeat(contexts, T, axis=0), queries.repeat_interleave(T, dim=0),
                                         every_target, key_means=key_means).reshape(n, T)
    return log_joint - torch.logsumexp(log_all, dim=1)


def train_alternating(train, n_symbols, *, query_dim, hidden, rounds, steps, lr, sigma2, em_its, seed):
    contexts, x, t = train
    encoder = make_encoder(x.shape[1], query_dim, hidden, seed)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=lr)
    x_t = torch.from_numpy(x)
    head = None
    for _ in range(rounds):
        # EM: the head's closed-form refit on the encoder's current queries.
        with torch.no_grad():
            queries = encoder(x_t).numpy()
        head = fit_head(contexts, queries, t, n_symbols, sigma2=sigma2, estimate_sigma2=False, max_its=em_its,
                        seed=seed, prev=head)
        # SGD: the encoder and the key means (a Parameter starting at the EM keys) through the head.
        key_means = torch.nn.Parameter(torch.tensor(np.array(head.key_means)))
        key_optimizer = torch.optim.Adam([key_means], lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            key_optimizer.zero_grad()
            loss = -conditional_log_likelihood(head, contexts, encoder(x_t), t, key_means).mean()
            loss.backward()
            optimizer.step()
            key_optimizer.step()
        head = attnmix.ResponsibilityAttentionDistribution(key_means.detach().numpy(), head.emission,
                                                           head.position_prior, head.sigma2)
    with torch.no_grad():
        queries = encoder(x_t).numpy()
    head = fit_head(contexts, queries, t, n_symbols, sigma2=sigma2, estimate_sigma2=False, max_its=em_its,
                    seed=seed, prev=head)
    return encoder, head


# ---- the comparison ---------------------------------------------------------------------------------------------


def run(*, n_train=3000, n_test=2000, seed=7, n_symbols=16, context_length=6, query_dim=16, hidden=0,
        raw_em_its=60, classifier_epochs=400, rounds=10, steps=30, em_its=15, lr=0.02, sigma2=0.1,
        with_context_baseline=True, verbose=True):
    """Fits (a), (b) and (c) and returns their held-out accuracies (and the seconds each took)."""
    torch.set_num_threads(1)
    (train_rows, test_rows, target_of_symbol) = make_task(n_train, n_test, seed, n_symbols=n_symbols,
                                                          context_length=context_length)
    train, test = train_rows[:3], test_rows[:3]
    results = {}

    start = time.perf_counter()
    raw_head = fit_head(*train, n_symbols, sigma2=1.0, estimate_sigma2=True, max_its=raw_em_its, seed=seed)
    results["head_on_raw_inputs"] = accuracy(raw_head.predict_proba(test[0], test[1]), test[2])
    results["seconds_a"] = time.perf_counter() - start

    # (a*): keys at the true class means of the raw training inputs, the true map as emission, pooled variance.
    x, symbols = train[1], train_rows[3]
    means = np.stack([x[symbols == s].mean(axis=0) if np.any(symbols == s) else np.zeros(x.shape[1])
                      for s in range(n_symbols)])
    emission = np.full((n_symbols, n_symbols), 1e-6)
    emission[np.arange(n_symbols), target_of_symbol] = 1.0
    emission /= emission.sum(axis=1, keepdims=True)
    oracle = attnmix.ResponsibilityAttentionDistribution(means, emission, np.full(context_length, 1 / context_length),
                                                         float(np.mean((x - means[symbols]) ** 2)))
    results["oracle_head_on_raw_inputs"] = accuracy(oracle.predict_proba(test[0], test[1]), test[2])

    start = time.perf_counter()
    classifier = train_classifier(train, n_symbols, query_dim=query_dim, hidden=hidden, epochs=classifier_epochs,
                                  lr=lr, seed=seed)
    with torch.no_grad():
        results["encoder_softmax"] = accuracy(classifier(test[0], torch.from_numpy(test[1])).numpy(), test[2])
    results["seconds_b"] = time.perf_counter() - start

    if with_context_baseline:  # (b+): the classifier also sees the context, as a multi-hot vector
        classifier = train_classifier(train, n_symbols, query_dim=query_dim, hidden=hidden,
                                      epochs=classifier_epochs, lr=lr, seed=seed, use_context=True)
        with torch.no_grad():
            results["encoder_softmax_with_context"] = accuracy(
                classifier(test[0], torch.from_numpy(test[1])).numpy(), test[2])

    start = time.perf_counter()
    encoder, head = train_alternating(train, n_symbols, query_dim=query_dim, hidden=hidden, rounds=rounds,
                                      steps=steps, lr=lr, sigma2=sigma2, em_its=em_its, seed=seed)
    with torch.no_grad():
        test_queries = encoder(torch.from_numpy(test[1])).numpy()
    results["encoder_em_head"] = accuracy(head.predict_proba(test[0], test_queries), test[2])
    results["seconds_c"] = time.perf_counter() - start

    if verbose:
        print(f"held-out accuracy on {n_test} rows (S={n_symbols}, N={context_length}, {n_train} training rows):")
        print(f"  (a) EM head on raw inputs         {results['head_on_raw_inputs']:.3f}"
              f"   ({results['seconds_a']:.1f} s)")
        print(f"  (a*) raw inputs, true-mean keys   {results['oracle_head_on_raw_inputs']:.3f}"
              "   (reference: uses the hidden symbols)")
        print(f"  (b) encoder + softmax classifier  {results['encoder_softmax']:.3f}"
              f"   ({results['seconds_b']:.1f} s)")
        if with_context_baseline:
            print(f"  (b+) (b) also given the context   {results['encoder_softmax_with_context']:.3f}"
                  "   (reference: a multi-hot context input)")
        print(f"  (c) encoder + EM head, alternated {results['encoder_em_head']:.3f}"
              f"   ({results['seconds_c']:.1f} s)")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=10, help="EM refits / encoder phases of (c)")
    parser.add_argument("--steps", type=int, default=30, help="Adam steps of the encoder per round of (c)")
    parser.add_argument("--classifier-epochs", type=int, default=400, help="full-batch Adam steps of (b)")
    parser.add_argument("--hidden", type=int, default=0, help="hidden units of the encoder (0: a linear encoder)")
    parser.add_argument("--no-context-baseline", action="store_true", help="skip the reference line (b+)")
    args = parser.parse_args(argv)
    results = run(n_train=args.n_train, n_test=args.n_test, seed=args.seed, rounds=args.rounds, steps=args.steps,
                  classifier_epochs=args.classifier_epochs, hidden=args.hidden,
                  with_context_baseline=not args.no_context_baseline)
    ok = results["encoder_em_head"] > max(results["head_on_raw_inputs"], results["encoder_softmax"])
    print("(c) beats (a) and (b)" if ok else "(c) does NOT beat both (a) and (b)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
