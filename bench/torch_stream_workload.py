"""What pytorch_spine.py and pytorch_moment_closure.py share, mirroring bench/stream_workload.hpp: the benchmark
token stream (a Lehmer hash of row and absolute position), the AdamW settings, and the spine layer in the C++
construction order (SpineLayer: ln1, qkv, proj, ln2, fc1, fc2), so that the same seed gives the same parameters."""
import torch
import torch.nn as nn

VOCAB = 256
SEED = 1234
LR, WEIGHT_DECAY = 1e-3, 0.01
POOL = 16  # distinct chunks cycled through by the training benchmarks
MODULUS = 2147483647


def stream_tokens(batch, start, length, vocab=VOCAB):
    """(batch, length) int64 tokens at absolute positions start ... start + length - 1."""
    p = torch.arange(start, start + length, dtype=torch.long).unsqueeze(0)
    r = torch.arange(batch, dtype=torch.long).unsqueeze(1)
    h = torch.remainder(p * 48271 + r * 1000003 + 1, MODULUS)
    h = torch.remainder(h * 48271, MODULUS)
    h = torch.remainder(h * 48271, MODULUS)
    return torch.remainder(h, vocab)


def stream_chunk(batch, chunk, c):
    """Chunk c: x = tokens c*chunk ... c*chunk + chunk - 1, y = the tokens one position later."""
    return stream_tokens(batch, c * chunk, chunk), stream_tokens(batch, c * chunk + 1, chunk)


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
