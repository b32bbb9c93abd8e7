# SPDX-License-Identifier: Apache-2.0
"""A Transformer of your own around MomentClosureSelfAttention, trained with torch.optim.AdamW on far-field recall.

The model is ordinary PyTorch: an embedding, blocks of ``LayerNorm -> MomentClosureSelfAttention -> residual ->
LayerNorm -> MLP (GELU) -> residual``, a final LayerNorm and a head tied to the embedding. Only the attention
sublayer comes from attnmix: a sliding window of exact attention plus a bounded far field, a few Gaussian clusters
per head that summarise the keys and values that left the window and share the window's softmax.

The task (multi-query associative recall beyond the window): each sequence stores key-value pairs, then filler
tokens, then asks some of the keys again; the model must name each one's value::

    k1 v1 k2 v2 ... kP vP  f f ... f  q1 a1 q2 a2 ... qQ aQ

With the filler gap at least as long as the window, every pair has left the window before it is asked for, so a
window-only model can only guess (chance: 1 / values); this model must recall through its clusters. Sequences are
streamed in chunks, each layer's state carried (and backpropagated through) from chunk to chunk. The loss is the
cross-entropy at the answers; accuracy is the argmax at the answers of fresh held-out sequences.

The settings, the sequences (drawn by attnmix's own generator), the initial parameters (same seed, same
construction order) and the training recipe (AdamW with weight decay 0.01, gradient clipping at 1) are those of
``attnmix lm recall``; the script then runs attnmix's built-in moment-closure model on the same settings
(``attnmix.experimental.run_recall``) and prints both accuracies.

Run ``python3 examples/torch_recall_transformer.py`` (the ``attnmix lm recall`` defaults; about a minute on one
core), ``--small`` for a quick version (2 pairs of 8 keys and 8 values, window 8; a few seconds), ``--help`` for
every setting.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

import attnmix.experimental
from attnmix import _torch
from attnmix.torch import MomentClosureSelfAttention

TASK_FIELDS = ("keys", "values", "filler", "pairs", "queries", "gap")


class Block(torch.nn.Module):
    """One pre-norm Transformer block with attnmix's streaming attention."""

    def __init__(self, d_model, n_head, window, max_clusters, birth_threshold):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.attn = MomentClosureSelfAttention(d_model, n_head, window, max_clusters, birth_threshold)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc1 = torch.nn.Linear(d_model, 4 * d_model)
        self.fc2 = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, h, state):
        a, state = self.attn(self.ln1(h), state)
        h = h + a
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h)))), state


class RecallTransformer(torch.nn.Module):
    def __init__(self, vocab, d_model, n_layer, n_head, window, max_clusters, birth_threshold):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d_model)
        self.blocks = torch.nn.ModuleList(
            [Block(d_model, n_head, window, max_clusters, birth_threshold) for _ in range(n_layer)]
        )
        self.ln_f = torch.nn.LayerNorm(d_model)

    def forward(self, x, states=None):
        """Logits of a chunk x (batch, t) and the blocks' states after it (None: new streams)."""
        states = states or [None] * len(self.blocks)
        h = self.tok(x)
        new_states = []
        for block, state in zip(self.blocks, states):
            h, state = block(h, state)
            new_states.append(state)
        return self.ln_f(h) @ self.tok.weight.T, new_states  # the head is tied to the embedding

    def stream(self, x, chunk):
        """Logits of whole sequences x (batch, length), streamed chunk by chunk with the states carried."""
        states, logits = None, []
        for start in range(0, x.shape[1], chunk):
            out, states = self(x[:, start : start + chunk], states)
            logits.append(out)
        return torch.cat(logits, 1)


def batches(settings, stream, sizes):
    """(x, y, answers) per batch size, from attnmix's recall generator (stream 0: training, 1: held out)."""
    task = {name: settings[name] for name in TASK_FIELDS}
    for tokens, answers in _torch._recall_sequences(settings["seed"], stream, sizes, **task):
        yield tokens[:, :-1], tokens[:, 1:], answers


def train_and_evaluate(settings, log=print):
    torch.manual_seed(settings["seed"])
    vocab = settings["keys"] + settings["values"] + settings["filler"]
    model = RecallTransformer(
        vocab,
        settings["d_model"],
        settings["n_layer"],
        settings["n_head"],
        settings["window"],
        settings["max_clusters"],
        settings["birth_threshold"],
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings["lr"], weight_decay=0.01)
    steps, batch, chunk = settings["steps"], settings["batch"], settings["chunk"]
    losses = []
    start = time.perf_counter()
    for step, (x, y, answers) in enumerate(batches(settings, 0, [batch] * steps), 1):
        logits = model.stream(x, chunk)
        loss = F.cross_entropy(logits[answers], y[answers])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, steps // 10) == 0:
            log(f"  step {step:4d}/{steps}  answer loss {sum(losses[-10:]) / len(losses[-10:]):.3f}")
    seconds = time.perf_counter() - start

    n_eval = settings["eval_sequences"]
    sizes = [min(batch, n_eval - done) for done in range(0, n_eval, batch)]
    correct = total = 0
    with torch.no_grad():
        for x, y, answers in batches(settings, 1, sizes):
            predicted = model.stream(x, chunk)[answers].argmax(-1)
            correct += int((predicted == y[answers]).sum())
            total += int(answers.sum())
    k = min(10, len(losses))
    return {
        "accuracy": correct / total,
        "answers": total,
        "first_loss": sum(losses[:k]) / k,
        "last_loss": sum(losses[-k:]) / k,
        "seconds": seconds,
    }


def main(argv=None):
    defaults = attnmix.experimental.default_recall_options()
    defaults["steps"] = 400  # `attnmix lm recall`'s default (run_recall's own is 300)
    small = dict(keys=8, values=8, pairs=2, queries=2, gap=12, window=8, chunk=8, steps=150, lr=0.01,
                 eval_sequences=256)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the quick settings: " + ", ".join(
        f"{k} {v}" for k, v in small.items()))
    for name in ("keys", "values", "filler", "pairs", "queries", "gap", "d_model", "n_layer", "n_head", "window",
                 "chunk", "max_clusters", "batch", "steps", "eval_sequences", "seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, help=f"default {defaults[name]}")
    parser.add_argument("--birth-threshold", type=float, help=f"default {defaults['birth_threshold']}")
    parser.add_argument("--lr", type=float, help=f"AdamW learning rate (default {defaults['lr']})")
    parser.add_argument("--no-compare", action="store_true", help="skip attnmix's built-in model")
    parser.add_argument("--json", action="store_true", help="end with a one-line JSON summary")
    args = parser.parse_args(argv)

    settings = {k: v for k, v in defaults.items() if k != "threads"}
    if args.small:
        settings.update(small)
    for name in settings:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    torch.set_num_threads(1)  # as attnmix lm recall (--threads 1): one core, results independent of the machine

    length = 2 * settings["pairs"] + settings["gap"] + 2 * settings["queries"]
    chance = 1.0 / settings["values"]
    print(
        f"Far-field recall: {settings['pairs']} pairs, gap {settings['gap']}, {settings['queries']} queries "
        f"({length} tokens), window {settings['window']}, chunks of {settings['chunk']}; d_model "
        f"{settings['d_model']}, {settings['n_layer']} blocks, {settings['n_head']} heads, up to "
        f"{settings['max_clusters']} clusters; {settings['steps']} AdamW steps of {settings['batch']} sequences"
    )
    print("Your Transformer (torch.nn modules around attnmix.torch.MomentClosureSelfAttention):")
    ours = train_and_evaluate(settings)
    noise = math.sqrt(chance * (1 - chance) / ours["answers"])
    print(
        f"  accuracy {ours['accuracy']:.3f} on {ours['answers']} held-out answers (chance {chance:.4f}, standard "
        f"error at chance {noise:.3f}); trained in {ours['seconds']:.1f} s"
    )
    summary = {"settings": settings, **ours}
    if not args.no_compare:
        options = {k: v for k, v in settings.items()}
        builtin = attnmix.experimental.run_recall("moment-closure", threads=1, **options)
        acc, ref = ours["accuracy"], builtin["accuracy"]
        # The band. Both accuracies are binomial estimates on the same held-out answers (standard error about 0.01
        # at an accuracy of 0.3 on 2048 answers), and the two models start from the same parameters and see the
        # same sequences in the same order; they differ only in rounding (torch's kernels for the embedding, the
        # MLP and the optimizer against attnmix's), which training can amplify. With the default settings, seeds
        # 0, 1 and 2 gave 0.311/0.311, 0.300/0.300 and 0.297/0.303. A difference of up to 0.05 (five standard
        # errors) is the same band; both lie far above chance.
        band = 0.05
        print("attnmix's built-in MomentClosureAttention, same settings (attnmix.experimental.run_recall):")
        print(f"  accuracy {ref:.3f}; trained in {builtin['seconds']:.1f} s")
        verdict = "within" if abs(acc - ref) <= band else "OUTSIDE"
        print(f"Difference {acc - ref:+.3f}: {verdict} the band of +-{band} (both far above chance {chance:.4f}).")
        summary["run_recall_accuracy"] = ref
        summary["within_band"] = abs(acc - ref) <= band
    if args.json:
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
