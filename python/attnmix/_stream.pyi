# SPDX-License-Identifier: Apache-2.0
"""Type stubs of attnmix._stream, the streaming part of attnmix on numpy arrays, re-exported by attnmix.experimental
(docs/mechanisms.md#streaming-language-model, docs/mechanisms.md#moment-closure-far-field)."""
from collections.abc import Callable, Iterator
from os import PathLike
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str

ArrayLike = npt.ArrayLike
Array = npt.NDArray[np.float64]
Path = str | PathLike[str]
Receipt = dict[str, Any]

class ClusterBank:
    """One layer's far-field mixtures, one per stream (docs/mechanisms.md#moment-closure-far-field); properties are
    float64 copies."""
    def __init__(
        self,
        count: ArrayLike,
        mu_k: ArrayLike,
        mu_v: ArrayLike,
        sigma_kk: ArrayLike,
        sigma_vk: ArrayLike,
        n_clusters: ArrayLike,
        max_clusters: int | None = None,
    ) -> None: ...
    @property
    def count(self) -> Array: ...
    @property
    def mu_k(self) -> Array: ...
    @property
    def mu_v(self) -> Array: ...
    @property
    def sigma_kk(self) -> Array: ...
    @property
    def sigma_vk(self) -> Array: ...
    @property
    def n_clusters(self) -> npt.NDArray[np.int64]: ...
    @property
    def max_clusters(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    def total_per_head(self) -> Array: ...

def empty_cluster_bank(batch_size: int, n_head: int, max_clusters: int, head_dim: int) -> ClusterBank: ...
def mgf_cluster_attention(q: ArrayLike, bank: ClusterBank) -> tuple[Array, Array]: ...
def cluster_responsibilities(k: ArrayLike, bank: ClusterBank) -> Array: ...
def update_cluster_bank(bank: ClusterBank, k: ArrayLike, v: ArrayLike, r: ArrayLike) -> ClusterBank: ...
def birth_and_merge(
    bank: ClusterBank,
    k: ArrayLike,
    v: ArrayLike,
    *,
    birth_threshold: float,
    merge_threshold: float | None = None,
    outlier_top_k: int = 4,
    cluster_rule: str = "threshold",
) -> tuple[ClusterBank, list[Receipt]]: ...
def ingest_cluster_batch(
    bank: ClusterBank,
    k: ArrayLike,
    v: ArrayLike,
    *,
    birth_threshold: float,
    merge_threshold: float | None = None,
    outlier_top_k: int = 4,
    cluster_rule: str = "threshold",
) -> tuple[ClusterBank, list[Receipt]]: ...

class GaussianLaw:
    def __init__(self, mean: ArrayLike | None = None, cov: ArrayLike | None = None, *, mu: ArrayLike | None = None,
                 covar: ArrayLike | None = None) -> None: ...
    @property
    def mean(self) -> Array: ...
    @property
    def cov(self) -> Array: ...
    @property
    def mu(self) -> Array: ...
    @property
    def covar(self) -> Array: ...
    def __iter__(self) -> Iterator[Array]: ...

def attention_law(
    law: GaussianLaw | tuple[ArrayLike, ArrayLike],
    qkv_weight: ArrayLike,
    qkv_bias: ArrayLike,
    proj_weight: ArrayLike,
    proj_bias: ArrayLike | None = None,
    n_head: int = 1,
) -> tuple[GaussianLaw, Array]: ...
def rope_tables(positions: ArrayLike, head_dim: int) -> tuple[Array, Array]: ...
def rotate_half(x: ArrayLike) -> Array: ...
def apply_rope(x: ArrayLike, cos: ArrayLike, sin: ArrayLike) -> Array: ...
def default_train_options() -> dict[str, Any]: ...
def train_language_model(
    tokens: ArrayLike,
    *,
    heldout: ArrayLike | None = None,
    out: Path | None = None,
    resume_from: Path | None = None,
    on_progress: Callable[[dict[str, Any]], object] | None = None,
    # >>> generated: train_language_model (scripts/generate_stubs.py)
    mechanism: Literal["window", "moment-closure", "linear", "frequent-directions", "tensor-sketch", "full"] = 'window',
    vocab: int = 256,
    window: int = 64,
    max_clusters: int = 4,
    birth_threshold: float = -2.0,
    merge_threshold: float | None = None,
    cluster_rule: Literal["threshold", "budget"] = 'threshold',
    outlier_capacity: int = 0,
    sketch_rows: int = 16,
    sketch_dim: int = 64,
    sketch_degree: int = 2,
    d_model: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    batch: int = 8,
    chunk: int = 64,
    steps: int = 300,
    detach_horizon: int = 1,
    lr: float = 0.003,
    min_lr_ratio: float = 0.1,
    schedule: Literal["cosine", "constant"] = 'cosine',
    weight_decay: float = 0.01,
    clip: float = 1.0,
    seed: int = 0,
    threads: int = 1,
    checkpoint_every: int = 0,
    eval_every: int = 0,
    # <<< generated: train_language_model
) -> dict[str, Any]: ...
def evaluate_language_model(
    checkpoint: Path,
    tokens: ArrayLike,
    *,
    chunk: int = 64,
    threads: int = 1,
    window_cache: Literal["float32", "int8"] = "float32",
) -> dict[str, Any]: ...
def default_generate_options() -> dict[str, Any]: ...
def generate_language_model(
    checkpoint: Path,
    prompt: ArrayLike,
    *,
    # >>> generated: generate_language_model (scripts/generate_stubs.py)
    tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 0,
    seed: int = 0,
    threads: int = 1,
    window_cache: Literal["float32", "int8"] = 'float32',
    # <<< generated: generate_language_model
) -> npt.NDArray[np.int64]: ...
def checkpoint_info(checkpoint: Path) -> dict[str, Any]: ...
def byte_tokens(text: str | bytes) -> npt.NDArray[np.int64]: ...
def default_recall_options() -> dict[str, Any]: ...
def run_recall(
    mechanism: str,
    *,
    on_step: Callable[[int, float], object] | None = None,
    # >>> generated: run_recall (scripts/generate_stubs.py)
    keys: int = 16,
    values: int = 16,
    filler: int = 8,
    pairs: int = 4,
    queries: int = 4,
    gap: int = 24,
    window: int = 16,
    chunk: int = 16,
    d_model: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    max_clusters: int = 4,
    birth_threshold: float = -2.0,
    cluster_rule: Literal["threshold", "budget"] = 'threshold',
    outlier_capacity: int = 8,
    sketch_rows: int = 16,
    sketch_dim: int = 64,
    sketch_degree: int = 2,
    batch: int = 32,
    steps: int = 300,
    lr: float = 0.003,
    eval_sequences: int = 512,
    threads: int = 1,
    seed: int = 0,
    # <<< generated: run_recall
) -> dict[str, Any]: ...
def default_memory_bench_options() -> dict[str, Any]: ...
def run_memory_benchmark(
    *,
    on_run: Callable[[int, int, str, str, str, int], object] | None = None,
    # >>> generated: run_memory_benchmark (scripts/generate_stubs.py)
    mechanisms: list[Literal["window", "moment-closure", "moment-closure+outliers", "linear", "frequent-directions", "tensor-sketch", "full"]] = ['window', 'moment-closure', 'moment-closure+outliers', 'linear', 'frequent-directions', 'tensor-sketch', 'full'],
    tasks: list[Literal["recall", "mqar", "passkey"]] = ['recall', 'mqar', 'passkey'],
    recall_gaps: list[int] = [24, 64, 256, 1024],
    recall_pairs: list[int] = [1, 4, 16],
    keys: int = 16,
    values: int = 16,
    mqar_lengths: list[int] = [64, 128, 256, 512],
    mqar_pairs: int = 16,
    passkey_lengths: list[int] = [1024, 4096],
    seeds: list[int] = [0],
    window: int = 16,
    chunk: int = 16,
    d_model: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    max_clusters: int = 4,
    birth_threshold: float = -2.0,
    cluster_rule: Literal["threshold", "budget"] = 'threshold',
    outlier_capacity: int = 8,
    sketch_rows: int = 16,
    sketch_dim: int = 64,
    sketch_degree: int = 2,
    batch: int = 32,
    steps: int = 300,
    lr: float = 0.003,
    eval_sequences: int = 512,
    threads: int = 1,
    # <<< generated: run_memory_benchmark
) -> dict[str, Any]: ...
def _option_tables() -> dict[str, list[dict[str, Any]]]: ...
def _raise(kind: str, message: str, rows: list[int] = ..., error_number: int = ...) -> None: ...
