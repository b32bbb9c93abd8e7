# SPDX-License-Identifier: Apache-2.0
"""Text corpora through a vocabulary: `attnmix fit --text` writes the vocabulary it used next to the model, `score
--text` and `predict --text` read the corpus through it (unknown tokens: the vocabulary's <unk> entry, else an error
naming file, line and token), and `fit --text --vocabulary V --embeddings E` gives real-valued queries, the rows of
`sequence_to_triples(tokens, N, embeddings=E)`."""
import json
import subprocess

import numpy as np
import pytest

import attnmix
from attnmix import ResponsibilityAttentionEstimator, load_model, optimize
from helpers import cli, run_cli

WORDS = ("the cat sat on the mat and the dog sat on the log while the cat ran to the dog " * 4).split()


def run_failing(*args):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True)


def total_of(stdout):
    return float(stdout.split("total=")[1].split()[0])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(WORDS[:40]) + "\n" + " ".join(WORDS[40:]) + "\n")
    return path


def test_fit_writes_its_vocabulary_and_score_and_predict_read_text_through_it(corpus, tmp_path):
    fit = run_cli("fit", "--text", corpus, "--tokens", "words", "--context-length", 3, "--max-its", 5, "--seed", 2,
                  "--out", tmp_path / "lm.json").stdout
    assert f"vocabulary      {tmp_path / 'lm.vocab.json'} (read by score and predict --text)" in fit
    doc = json.loads((tmp_path / "lm.vocab.json").read_text())
    first_seen = list(dict.fromkeys(WORDS))
    assert doc == {"format": "attnmix-vocabulary", "tokens": "words", "queries": "symbols", "entries": first_seen}
    fit_total = float(fit.split("(total ")[1].split(")")[0])
    score = run_cli("score", "--model", tmp_path / "lm.json", "--text", corpus).stdout
    assert score.startswith(f"rows={len(WORDS) - 3} ")
    assert total_of(score) == pytest.approx(fit_total, rel=1e-9)  # the fit prints its total rounded
    model = load_model(tmp_path / "lm.json")
    ids = np.array([first_seen.index(w) for w in WORDS])
    triples = attnmix.sequence_to_triples(ids, 3, num_symbols=len(first_seen))
    assert total_of(score) == attnmix.inference.score(model, triples)
    predicted = run_cli("predict", "--model", tmp_path / "lm.json", "--text", corpus)
    proba = model.predict_proba(np.array([c for c, _, _ in triples]), np.array([q for _, q, _ in triples]))
    assert [int(line.split("\t")[0]) for line in predicted.stdout.splitlines()] == list(proba.argmax(1))
    assert predicted.stderr.startswith("accuracy=")


def test_the_fit_summary_gives_the_next_token_log_loss_of_training_and_validation_rows(corpus, tmp_path):
    (tmp_path / "held_out.txt").write_text(" ".join(WORDS[5:30]) + "\n")
    fit = run_cli("fit", "--family", "ra-sparse", "--text", corpus, "--tokens", "words", "--context-length", 3,
                  "--max-its", 5, "--valid", tmp_path / "held_out.txt", "--out", tmp_path / "lm.json").stdout
    lines = [line for line in fit.splitlines() if "nats per token" in line]
    assert len(lines) == 2 and lines[0].startswith("  next token      log loss ") and "training" in lines[0]
    assert "validation" in lines[1]
    model = load_model(tmp_path / "lm.json")
    vocabulary = list(dict.fromkeys(WORDS))
    for line, words in ((lines[0], WORDS), (lines[1], WORDS[5:30])):
        # Oracle: the mean of -ln p(t | c, q) from the Python model's predictive distributions.
        ids = np.array([vocabulary.index(w) for w in words])
        triples = attnmix.sequence_to_triples(ids, 3, num_symbols=len(vocabulary), symbol_queries=True)
        contexts, queries, targets = (np.array([row[k] for row in triples]) for k in range(3))
        proba = model.predict_proba(contexts, queries)
        loss = -np.mean(np.log(proba[np.arange(len(targets)), targets]))
        printed = float(line.split("log loss ")[1].split()[0])
        perplexity = float(line.split("(perplexity ")[1].split(")")[0])
        assert printed == pytest.approx(loss, rel=5e-4)  # printed to 4 significant digits
        assert perplexity == pytest.approx(np.exp(loss), rel=5e-4)


def test_unknown_tokens_are_an_error_or_the_vocabularys_unk(corpus, tmp_path):
    run_cli("fit", "--text", corpus, "--tokens", "words", "--context-length", 2, "--max-its", 2,
            "--out", tmp_path / "lm.json")
    (tmp_path / "new.txt").write_text("the cat sat\non the bed\n")
    result = run_failing("score", "--model", tmp_path / "lm.json", "--text", tmp_path / "new.txt")
    assert result.returncode == 2
    assert f"new.txt: line 2: token 'bed' is not in the vocabulary {tmp_path / 'lm.vocab.json'}" in result.stderr
    # A plain vocabulary with an <unk> entry: fit and score read unknown words as <unk>.
    (tmp_path / "vocab.txt").write_text("\n".join(["<unk>", "the", "cat", "sat", "on", "dog"]) + "\n")
    fit = run_cli("fit", "--text", corpus, "--vocabulary", tmp_path / "vocab.txt", "--context-length", 2,
                  "--max-its", 2, "--out", tmp_path / "unk.json").stdout
    assert "(vocabulary: 6 words from" in fit and "unknown as <unk>" in fit
    scored = run_cli("score", "--model", tmp_path / "unk.json", "--text", tmp_path / "new.txt")
    assert "note: 1 tokens of" in scored.stderr and "were read as <unk>" in scored.stderr
    assert scored.stdout.startswith("rows=4 ")


def test_embeddings_give_the_queries_of_sequence_to_triples(corpus, tmp_path, rng):
    vocabulary = sorted(set(WORDS))
    (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    table = rng.normal(size=(len(vocabulary), 5))
    np.save(tmp_path / "emb.npy", table)
    np.savez(tmp_path / "emb.npz", embeddings=table, other=np.zeros(2))
    flags = ("--context-length", 3, "--max-its", 4, "--seed", 7, "--init-p", 0.3, "--delta", "none", "--sigma2", 2.0)
    for name in ("emb.npy", "emb.npz"):
        run_cli("fit", "--text", corpus, "--vocabulary", tmp_path / "vocab.txt", "--embeddings", tmp_path / name,
                *flags, "--out", tmp_path / f"{name}.json")
    ids = np.array([vocabulary.index(w) for w in WORDS])
    triples = attnmix.sequence_to_triples(ids, 3, num_symbols=len(vocabulary), embeddings=table)
    est = ResponsibilityAttentionEstimator(len(vocabulary), 3, 5, len(vocabulary), sigma2=2.0)
    python = optimize(triples, est, max_its=4, rng=7, init_p=0.3, delta=None, out=None)
    for name in ("emb.npy", "emb.npz"):
        fitted = load_model(tmp_path / f"{name}.json")
        assert fitted.query_dim == 5
        np.testing.assert_array_equal(fitted.key_means, python.key_means)
        np.testing.assert_array_equal(fitted.emission, python.emission)
    assert json.loads((tmp_path / "emb.npy.vocab.json").read_text())["queries"] == "embeddings"
    score = run_cli("score", "--model", tmp_path / "emb.npy.json", "--text", corpus, "--embeddings",
                    tmp_path / "emb.npy").stdout
    assert total_of(score) == attnmix.inference.score(python, triples)
    result = run_failing("score", "--model", tmp_path / "emb.npy.json", "--text", corpus)
    assert result.returncode == 2 and "give them again with --embeddings FILE" in result.stderr


def test_bad_vocabularies_and_embeddings_name_the_file_and_leave_nothing_written(corpus, tmp_path):
    out = tmp_path / "m.json"

    def fails(*args, code=2):
        result = run_failing("fit", "--text", corpus, "--context-length", 2, "--out", out, *args)
        assert result.returncode == code, result.stderr
        assert not out.exists() and not (tmp_path / "m.vocab.json").exists()
        return result.stderr

    (tmp_path / "twice.txt").write_text("the\ncat\nthe\n")
    assert "twice.txt: line 3: 'the' is listed twice (entry 0 already holds it)" in fails(
        "--vocabulary", tmp_path / "twice.txt")
    (tmp_path / "spaced.txt").write_text("the cat\n")
    assert "spaced.txt: line 1: 'the cat' is not one word" in fails("--vocabulary", tmp_path / "spaced.txt")
    vocabulary = sorted(set(WORDS))
    (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    np.save(tmp_path / "short.npy", np.zeros((3, 4)))
    assert f"short.npy: has shape (3, 4) but {tmp_path / 'vocab.txt'} lists {len(vocabulary)} tokens" in fails(
        "--vocabulary", tmp_path / "vocab.txt", "--embeddings", tmp_path / "short.npy")
    np.save(tmp_path / "ints.npy", np.zeros((len(vocabulary), 4), dtype=np.int64))
    assert "must be a 2-D float array (S, D)" in fails(
        "--vocabulary", tmp_path / "vocab.txt", "--embeddings", tmp_path / "ints.npy")
    assert "--embeddings needs --vocabulary FILE" in fails("--embeddings", tmp_path / "ints.npy", code=1)
    result = run_failing("fit", "--data", tmp_path / "d.jsonl", "--vocabulary", tmp_path / "vocab.txt", "--out", out)
    assert result.returncode == 1 and "--vocabulary applies only to --text corpora" in result.stderr
    # The vocabulary next to --out must not be an input.
    result = run_failing("fit", "--text", tmp_path / "lm.vocab.json", "--context-length", 2, "--out",
                         tmp_path / "lm.json")
    assert result.returncode != 0 and "lm.vocab.json" in result.stderr


def test_character_vocabularies_hold_newlines_exactly(tmp_path):
    (tmp_path / "c.txt").write_text("abba\ncab\nabc\n" * 5)
    run_cli("fit", "--text", tmp_path / "c.txt", "--context-length", 2, "--max-its", 3, "--out", tmp_path / "c.json")
    doc = json.loads((tmp_path / "c.vocab.json").read_text())
    assert doc["tokens"] == "chars" and doc["entries"] == ["a", "b", "\n", "c"]
    scored = run_cli("score", "--model", tmp_path / "c.json", "--text", tmp_path / "c.txt").stdout
    assert scored.startswith("rows=63 ")  # 65 characters, N = 2


def test_a_fit_from_an_init_model_reads_its_vocabulary(corpus, tmp_path):
    """fit --text --init M.json reads the text through M.vocab.json, so the symbols keep the ids the model has."""
    run_cli("fit", "--text", corpus, "--tokens", "words", "--context-length", 3, "--max-its", 2, "--out",
            tmp_path / "first.json")
    (tmp_path / "reordered.txt").write_text(" ".join(reversed(WORDS)) + "\n")  # another first-appearance order
    fit = run_cli("fit", "--text", tmp_path / "reordered.txt", "--tokens", "words", "--init", tmp_path / "first.json",
                  "--max-its", 2, "--out", tmp_path / "second.json").stdout
    assert f"words from {tmp_path / 'first.vocab.json'})" in fit
    assert (tmp_path / "second.vocab.json").read_text() == (tmp_path / "first.vocab.json").read_text()
    (tmp_path / "new.txt").write_text("the cat sat on a bed\n")
    result = run_failing("fit", "--text", tmp_path / "new.txt", "--tokens", "words", "--init", tmp_path / "first.json",
                         "--out", tmp_path / "third.json")
    assert result.returncode == 2
    assert f"token 'a' is not in the vocabulary {tmp_path / 'first.vocab.json'}" in result.stderr


def test_tokens_that_are_not_utf8_are_written_as_their_bytes(tmp_path):
    """A stray byte of a character split (and a word holding one) is no JSON string: the vocabulary lists its byte
    values, and score reads the text back through it."""
    (tmp_path / "b.txt").write_bytes(b"ab\xffba\xfe\xffab\n" * 3)
    run_cli("fit", "--text", tmp_path / "b.txt", "--context-length", 2, "--max-its", 2, "--out", tmp_path / "b.json")
    assert json.loads((tmp_path / "b.vocab.json").read_text())["entries"] == ["a", "b", [255], [254], "\n"]
    assert run_cli("score", "--model", tmp_path / "b.json", "--text", tmp_path / "b.txt").stdout.startswith("rows=28 ")
    (tmp_path / "w.txt").write_bytes(b"caf\xe9 bar caf\xe9 bar\n")
    run_cli("fit", "--text", tmp_path / "w.txt", "--tokens", "words", "--context-length", 1, "--max-its", 2,
            "--out", tmp_path / "w.json")
    assert json.loads((tmp_path / "w.vocab.json").read_text())["entries"] == [[99, 97, 102, 233], "bar"]
    assert run_cli("score", "--model", tmp_path / "w.json", "--text", tmp_path / "w.txt").stdout.startswith("rows=3 ")
