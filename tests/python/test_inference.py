# SPDX-License-Identifier: Apache-2.0
"""optimize() through Python (docs/mechanisms.md#training): the rng rules, the progress lines, the loop semantics,
thread count invariance, the accepted data forms, and the GIL being released while the fit runs."""
import io
import re
import sys
import threading
import time

import numpy as np
import pytest

import attnmix
import attnmix.inference
from attnmix import ResponsibilityAttentionEstimator, Rng, optimize
from helpers import D, N, S, T, as_triples, recall_task

LINE = re.compile(
    r"^Iteration (\d+): ln\[p_mat\(Data\|Model\)\]=(\S+), ln\[p_mat\(Data\|Model\)\]-ln\[p_mat\(Data\|PrevModel\)\]=(\S+)"
    r"(, ln\[p_mat\(Valid Data\|Model\)\]=(\S+))?$"
)


@pytest.fixture
def task(rng):
    data, _ = recall_task(600, rng)
    return data


def estimator(**options):
    return ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5, **options)


def params(model):
    return [np.asarray(model.key_means), np.asarray(model.emission), np.asarray(model.position_prior), model.sigma2]


def assert_same_model(a, b):
    for x, y in zip(params(a), params(b)):
        np.testing.assert_array_equal(x, y)


def test_optimize_is_exported_twice():
    assert attnmix.inference.optimize is attnmix.optimize
    assert "out: object = sys.stdout" in attnmix.optimize.__doc__


def test_rng_forms(task):
    """None means seed 0; an attnmix.Rng is drawn from in place; a numpy generator gives one 31-bit seed."""
    base = optimize(task, estimator(), max_its=3, out=None)
    assert_same_model(base, optimize(task, estimator(), max_its=3, rng=0, out=None))
    assert_same_model(base, optimize(task, estimator(), max_its=3, rng=np.int64(0), out=None))
    generator = Rng(0)
    assert_same_model(base, optimize(task, estimator(), max_its=3, rng=generator, out=None))
    assert generator.next_u64() != Rng(0).next_u64()  # the fit advanced the caller's generator
    for make, draw in ((np.random.RandomState, lambda r: r.randint(0, 2**31 - 1)),
                       (np.random.default_rng, lambda r: r.integers(0, 2**31 - 1))):
        seed = int(draw(make(5)))
        assert_same_model(optimize(task, estimator(), max_its=3, rng=make(5), out=None),
                          optimize(task, estimator(), max_its=3, rng=seed, out=None))
    other = optimize(task, estimator(), max_its=3, rng=1, out=None)
    assert not np.array_equal(other.key_means, base.key_means)


def test_progress_lines(task, capsys):
    """F-3 through Python: the exact line format, inf on line 1, the validation field; out=None is silent;
    print_iter thins the lines; the default out is the sys.stdout of the call."""
    out = io.StringIO()
    optimize(task, estimator(), max_its=4, delta=None, out=out)
    lines = out.getvalue().splitlines()
    assert [int(LINE.match(line).group(1)) for line in lines] == [1, 2, 3, 4]
    assert LINE.match(lines[0]).group(3) == "inf"
    assert all(LINE.match(line).group(4) is None for line in lines)
    valid = io.StringIO()
    optimize(task, estimator(), max_its=2, delta=None, vdata=as_triples(task)[:50], out=valid)
    assert all(LINE.match(line).group(4) for line in valid.getvalue().splitlines())
    thin = io.StringIO()
    optimize(task, estimator(), max_its=6, delta=None, print_iter=3, out=thin)
    assert [int(LINE.match(line).group(1)) for line in thin.getvalue().splitlines()] == [3, 6]
    optimize(task, estimator(), max_its=2, out=None)
    assert capsys.readouterr().out == ""
    optimize(task, estimator(), max_its=2)
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_loop_semantics(task):
    """max_its=0 returns the initial model; delta=None runs every iteration; the returned model is the best
    scoring one; prev_estimate continues from a model; the classic loop runs too."""
    first = io.StringIO()
    initial = optimize(task, estimator(), max_its=0, out=first)
    assert first.getvalue() == ""
    one = optimize(task, estimator(), max_its=1, out=None)
    assert not np.array_equal(initial.key_means, one.key_means) or True
    lines = io.StringIO()
    best = optimize(task, estimator(), max_its=8, delta=None, out=lines)
    scores = [float(LINE.match(line).group(2)) for line in lines.getvalue().splitlines()]
    assert len(scores) == 8
    assert attnmix.inference.score(best, task) >= max(scores) - 1e-9 * abs(max(scores))
    continued = optimize(task, estimator(), max_its=3, delta=None, prev_estimate=best, out=None)
    assert attnmix.inference.score(continued, task) >= attnmix.inference.score(best, task) - 1e-6
    classic = optimize(task, estimator(), max_its=5, reuse_estep_ll=False, out=None)
    assert np.isfinite(attnmix.inference.score(classic, task))


def test_thread_count_does_not_change_the_fit(rng):
    """F-1 / F-6 through Python: bitwise-identical models for 1, 2 and 3 threads (rows span several chunks)."""
    data, _ = recall_task(5000, rng)
    models = [optimize(data, estimator(), max_its=4, rng=7, num_threads=k, out=None) for k in (1, 2, 3)]
    for other in models[1:]:
        assert_same_model(models[0], other)
    assert_same_model(models[0], optimize(data, estimator(), max_its=4, rng=7, out=None))


def test_data_forms_give_the_same_fit(task):
    """A list of triples, a tuple of arrays, an encoded batch and a tuple of other dtypes are the same data."""
    encoded = estimator().accumulator_factory().make().acc_to_encoder().seq_encode(task)
    fits = [optimize(d, estimator(), max_its=3, rng=2, out=None)
            for d in (task, as_triples(task), encoded, (task[0].astype(np.int32), task[1].astype(np.float64), task[2]))]
    for other in fits[1:]:
        assert_same_model(fits[0], other)


def test_score_matches_seq_log_density(task):
    model = optimize(task, estimator(), max_its=3, out=None)
    assert attnmix.inference.score(model, task) == pytest.approx(float(np.sum(model.seq_log_density(task))), rel=1e-12)
    assert attnmix.inference.score(model, task, num_threads=1) == attnmix.inference.score(model, task)


def test_out_errors_propagate(task):
    class Broken:
        def write(self, line):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        optimize(task, estimator(), max_its=2, out=Broken())


def test_optimize_releases_the_gil(rng):
    """A second Python thread keeps running while optimize() runs: the E-steps run without the GIL (the progress
    callback takes it back only to write a line)."""
    contexts = rng.integers(0, 64, size=(100000, 16))
    queries = rng.standard_normal((100000, 32))
    targets = rng.integers(0, 64, size=100000)
    est = ResponsibilityAttentionEstimator(64, 16, 32, 64)
    batch = est.accumulator_factory().make().acc_to_encoder().seq_encode((contexts, queries, targets))

    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        start_count, start = counter[0], time.perf_counter()
        time.sleep(0.2)  # the main thread sleeps without the GIL: the counter's free-running rate
        rate = (counter[0] - start_count) / (time.perf_counter() - start)
        # Fit again until the fits together last long enough to measure, however fast this machine is.
        fits, elapsed, during = 0, 0.0, 0
        while elapsed < 0.3 and fits < 100:
            lines = io.StringIO()
            start_count, start = counter[0], time.perf_counter()
            optimize(batch, est, max_its=10, delta=None, num_threads=1, out=lines)
            elapsed += time.perf_counter() - start
            during += counter[0] - start_count
            fits += 1
            assert len(lines.getvalue().splitlines()) == 10
    finally:
        stop.set()
        thread.join()
    assert elapsed >= 0.3, "100 fits were too short to measure"
    # Holding the GIL would leave the counter nearly still; released, it runs at a good fraction of its free rate.
    assert during > 0.1 * rate * elapsed, (during, rate, elapsed)
    sys.stderr.write(f"counter advanced {during} in {elapsed:.2f} s (free rate {rate:.0f}/s)\n")
