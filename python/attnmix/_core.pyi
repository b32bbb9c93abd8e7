# SPDX-License-Identifier: Apache-2.0
"""Type stubs of attnmix._core, the compiled part of attnmix."""
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from os import PathLike
from typing import Any, Literal, TextIO, TypedDict, overload

import numpy as np
import numpy.typing as npt

__version__: str

ArrayLike = npt.ArrayLike
RngLike = None | int | Rng | np.random.RandomState | np.random.Generator
Observation = Any
Data = Sequence[Observation] | tuple[npt.NDArray[Any], ...] | EncodedBatch

class ImpossibleEvidenceError(ValueError):
    rows: list[int]
    def __init__(self, message: str = "", rows: Sequence[int] = ()) -> None: ...

class Rng:
    def __init__(self, seed: int = 0) -> None: ...
    def next_u64(self) -> int: ...
    def uniform(self) -> float: ...
    def uniform_open(self) -> float: ...
    def normal(self) -> float: ...
    def exponential(self) -> float: ...
    def gumbel(self) -> float: ...
    def bernoulli(self, p: float) -> bool: ...
    def uniform_int(self, n: int) -> int: ...
    def dirichlet_ones(self, n: int) -> npt.NDArray[np.float64]: ...
    def sample_without_replacement(self, n: int, k: int) -> npt.NDArray[np.int64]: ...
    def __copy__(self) -> Rng: ...
    def __deepcopy__(self, memo: Any) -> Rng: ...

class EncodedBatch:
    """Immutable, validated batch; unpacks and indexes like the reference's tuple of read-only arrays."""
    @property
    def n_rows(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int | slice) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...

# ---- role base classes ------------------------------------------------------------------------------------------

class DataEncoder:
    def seq_encode(self, x: Data) -> EncodedBatch: ...
    def row_count(self, x: Data) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...

class Distribution:
    def log_density(self, x: Observation) -> float: ...
    def density(self, x: Observation) -> float: ...
    def seq_log_density(self, x: Data) -> npt.NDArray[np.float64]: ...
    def estimator(self, pseudo_count: float | None = None) -> Estimator: ...
    def dist_to_encoder(self) -> DataEncoder: ...

class Accumulator:
    @property
    def keys(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...
    def seq_update(self, x: Data, weights: ArrayLike, estimate: Distribution) -> None: ...
    def update(self, x: Observation, weight: float, estimate: Distribution) -> None: ...
    def seq_initialize(self, x: Data, weights: ArrayLike, rng: RngLike) -> None: ...
    def initialize(self, x: Observation, weight: float, rng: RngLike) -> None: ...
    def combine(self, value: Any) -> Accumulator: ...
    def from_value(self, value: Any) -> Accumulator: ...
    def value(self) -> Any: ...
    def scale(self, c: float) -> Accumulator: ...
    def key_merge(self, stats_dict: MutableMapping[str, Any]) -> None: ...
    def key_replace(self, stats_dict: MutableMapping[str, Any]) -> None: ...
    def acc_to_encoder(self) -> DataEncoder: ...

class AccumulatorFactory:
    def make(self) -> Accumulator: ...

class Estimator:
    @property
    def pseudo_count(self) -> float | None: ...
    def accumulator_factory(self) -> AccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> Distribution: ...

# ---- responsibility attention ------------------------------------------------------------------------------------

class ResponsibilityAttentionDistribution(Distribution):
    def __init__(self, key_means: ArrayLike, emission: ArrayLike, position_prior: ArrayLike | None = None,
                 sigma2: float = 1.0, name: str | None = None, *,
                 precision: Literal["float64", "mixed"] = "float64") -> None: ...
    key_means: npt.NDArray[np.float64]
    emission: npt.NDArray[np.float64]
    position_prior: npt.NDArray[np.float64]
    log_position_prior: npt.NDArray[np.float64]
    sigma2: float
    precision: Literal["float64", "mixed"]
    gate_const: float
    name: str | None
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    def predict_proba(self, context: ArrayLike, query: ArrayLike) -> npt.NDArray[np.float64]: ...
    def responsibilities(self, x: Data) -> npt.NDArray[np.float64]: ...
    # Private (attnmix.torch.em_heads): vector-Jacobian products, (dL/dquery (n, D), dL/dkey_means (S, D)).
    def _log_density_vjp(self, context: ArrayLike, query: ArrayLike, target: ArrayLike,
                         grad: ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def _predict_proba_vjp(self, context: ArrayLike, query: ArrayLike,
                           grad: ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def sampler(self, seed: RngLike = None) -> ResponsibilityAttentionSampler: ...
    def estimator(self, pseudo_count: float | None = None) -> ResponsibilityAttentionEstimator: ...
    def dist_to_encoder(self) -> ResponsibilityAttentionDataEncoder: ...

class ResponsibilityAttentionSampler:
    def __init__(self, dist: ResponsibilityAttentionDistribution, seed: RngLike = None) -> None: ...
    dist: ResponsibilityAttentionDistribution
    @overload
    def sample(self, size: None = None, *, batched: bool = True) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], int]: ...
    @overload
    def sample(self, size: int, *, batched: bool = True) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], int]]: ...

# >>> generated: ResponsibilityAttentionEstimator (scripts/generate_stubs.py)
class ResponsibilityAttentionEstimator(Estimator):
    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        *,
        sigma2: float = 1.0,
        emission_smoothing: float = 1e-06,
        estimate_sigma2: bool = False,
        min_sigma2: float = 1e-06,
        precision: Literal["float64", "mixed"] = 'float64',
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    sigma2: float
    emission_smoothing: float
    estimate_sigma2: bool
    min_sigma2: float
    precision: Literal["float64", "mixed"]
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> ResponsibilityAttentionAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> ResponsibilityAttentionDistribution: ...
# <<< generated: ResponsibilityAttentionEstimator

class ResponsibilityAttentionAccumulator(Accumulator):
    def __init__(self, num_symbols: int, context_length: int, query_dim: int, num_targets: int,
                 keys: str | None = None, name: str | None = None) -> None: ...
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    # The statistics as attributes (read-only copies, as in value()).
    @property
    def key_sum(self) -> npt.NDArray[np.float64]: ...
    @property
    def key_mass(self) -> npt.NDArray[np.float64]: ...
    @property
    def emission_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def position_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def query_sq(self) -> float: ...
    def value(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64],
                             npt.NDArray[np.float64], float]: ...

class ResponsibilityAttentionAccumulatorFactory(AccumulatorFactory):
    def __init__(self, num_symbols: int, context_length: int, query_dim: int, num_targets: int,
                 keys: str | None = None, name: str | None = None) -> None: ...
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    def make(self) -> ResponsibilityAttentionAccumulator: ...

class ResponsibilityAttentionDataEncoder(DataEncoder):
    def __init__(self, num_symbols: int | None = None, context_length: int | None = None,
                 query_dim: int | None = None, num_targets: int | None = None) -> None: ...
    num_symbols: int | None
    context_length: int | None
    query_dim: int | None
    num_targets: int | None

@overload
def sequence_to_triples(tokens: ArrayLike, context_length: int, *, num_symbols: int | None = None,
                        embeddings: ArrayLike | None = None, symbol_queries: Literal[False] = False
                        ) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], int]]: ...
@overload
def sequence_to_triples(tokens: ArrayLike, context_length: int, *, num_symbols: int | None = None,
                        embeddings: None = None, symbol_queries: Literal[True]
                        ) -> list[tuple[npt.NDArray[np.int64], int, int]]: ...

# ---- responsibility attention with sparse tables --------------------------------------------------------------

class SparseTable(TypedDict):
    """A table as compressed rows: row r lists columns[row_begin[r]:row_begin[r+1]] with their values and holds
    default[r] at every other column."""
    shape: tuple[int, int]
    row_begin: npt.NDArray[np.int64]
    columns: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    default: npt.NDArray[np.float64]

class SparseResponsibilityAttentionDistribution(Distribution):
    def __init__(self, key_means: Mapping[str, Any], emission: Mapping[str, Any], position_prior: ArrayLike,
                 sigma2: float = 1.0, name: str | None = None) -> None: ...
    @property
    def key_means(self) -> SparseTable: ...
    @property
    def emission(self) -> SparseTable: ...
    position_prior: npt.NDArray[np.float64]
    sigma2: float
    gate_const: float
    name: str | None
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    def dense(self) -> ResponsibilityAttentionDistribution: ...
    def predict_proba(self, context: ArrayLike, query: ArrayLike | int) -> npt.NDArray[np.float64]: ...
    def responsibilities(self, x: Data) -> npt.NDArray[np.float64]: ...
    def estimator(self, pseudo_count: float | None = None) -> SparseResponsibilityAttentionEstimator: ...
    def dist_to_encoder(self) -> ResponsibilityAttentionDataEncoder: ...

# >>> generated: SparseResponsibilityAttentionEstimator (scripts/generate_stubs.py)
class SparseResponsibilityAttentionEstimator(Estimator):
    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        query_dim: int,
        num_targets: int,
        *,
        rows: Data,
        sigma2: float = 1.0,
        emission_smoothing: float = 1e-06,
        estimate_sigma2: bool = False,
        min_sigma2: float = 1e-06,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    sigma2: float
    emission_smoothing: float
    estimate_sigma2: bool
    min_sigma2: float
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> SparseResponsibilityAttentionAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> SparseResponsibilityAttentionDistribution: ...
# <<< generated: SparseResponsibilityAttentionEstimator

class SparseResponsibilityAttentionAccumulator(Accumulator):
    def __init__(self, num_symbols: int, context_length: int, query_dim: int, num_targets: int,
                 keys: str | None = None, name: str | None = None, *, rows: Data) -> None: ...
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    # The statistics as attributes (read-only copies, as in value()), one entry per listed cell.
    @property
    def key_sum(self) -> npt.NDArray[np.float64]: ...
    @property
    def key_mass(self) -> npt.NDArray[np.float64]: ...
    @property
    def emission_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def position_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def query_sq(self) -> float: ...
    def value(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64],
                             npt.NDArray[np.float64], float]: ...

class SparseResponsibilityAttentionAccumulatorFactory(AccumulatorFactory):
    def __init__(self, num_symbols: int, context_length: int, query_dim: int, num_targets: int,
                 keys: str | None = None, name: str | None = None, *, rows: Data) -> None: ...
    num_symbols: int
    context_length: int
    query_dim: int
    num_targets: int
    def make(self) -> SparseResponsibilityAttentionAccumulator: ...

# ---- chained attention ---------------------------------------------------------------------------------------------

CaObservation = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int, int]

class ChainedAttentionDistribution(Distribution):
    def __init__(self, keys: ArrayLike, emission: ArrayLike, sigma2: float = 0.1, name: str | None = None) -> None: ...
    key_tables: npt.NDArray[np.float64]
    emission: npt.NDArray[np.float64]
    sigma2: float
    name: str | None
    n_hops: int
    num_symbols: int
    num_targets: int
    def predict_proba(self, context_keys: ArrayLike, context_values: ArrayLike, query: ArrayLike
                      ) -> npt.NDArray[np.float64]: ...
    def posterior(self, x: Data) -> npt.NDArray[np.float64]: ...
    def sampler(self, seed: RngLike = None, *, context_length: int = 6) -> ChainedAttentionSampler: ...
    def estimator(self, pseudo_count: float | None = None) -> ChainedAttentionEstimator: ...
    def dist_to_encoder(self) -> ChainedAttentionDataEncoder: ...

class ChainedAttentionSampler:
    def __init__(self, dist: ChainedAttentionDistribution, seed: RngLike = None, *, context_length: int = 6) -> None: ...
    dist: ChainedAttentionDistribution
    @overload
    def sample(self, size: None = None, *, batched: bool = True) -> CaObservation: ...
    @overload
    def sample(self, size: int, *, batched: bool = True) -> list[CaObservation]: ...

# >>> generated: ChainedAttentionEstimator (scripts/generate_stubs.py)
class ChainedAttentionEstimator(Estimator):
    def __init__(
        self,
        n_hops: int,
        num_symbols: int,
        num_targets: int,
        *,
        sigma2: float = 0.1,
        emission_smoothing: float = 0.0001,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    n_hops: int
    num_symbols: int
    num_targets: int
    sigma2: float
    emission_smoothing: float
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> ChainedAttentionAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> ChainedAttentionDistribution: ...
# <<< generated: ChainedAttentionEstimator

class ChainedAttentionAccumulator(Accumulator):
    def __init__(self, n_hops: int, num_symbols: int, num_targets: int, keys: str | None = None,
                 name: str | None = None) -> None: ...
    n_hops: int
    num_symbols: int
    num_targets: int
    # The statistics as attributes (read-only copies, as in value()).
    @property
    def key_num(self) -> npt.NDArray[np.float64]: ...
    @property
    def key_mass(self) -> npt.NDArray[np.float64]: ...
    @property
    def emission_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def ll(self) -> float: ...
    @property
    def n(self) -> float: ...
    def value(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], float,
                             float]: ...

class ChainedAttentionAccumulatorFactory(AccumulatorFactory):
    def __init__(self, n_hops: int, num_symbols: int, num_targets: int, keys: str | None = None,
                 name: str | None = None) -> None: ...
    n_hops: int
    num_symbols: int
    num_targets: int
    def make(self) -> ChainedAttentionAccumulator: ...

class ChainedAttentionDataEncoder(DataEncoder):
    def __init__(self, num_symbols: int | None = None, num_targets: int | None = None) -> None: ...
    num_symbols: int | None
    num_targets: int | None

# ---- the optimizer state of the variational families ------------------------------------------------------------

class AttentionOptimizerState:
    """Immutable Adam state carried by a variational model; the arrays are read-only."""
    def __init__(self, family: str, mean: ArrayLike, log_var: ArrayLike, mean_first_moment: ArrayLike,
                 mean_second_moment: ArrayLike, log_var_first_moment: ArrayLike, log_var_second_moment: ArrayLike,
                 iteration: int = 0, seed: int = 0, schema_version: int = 1, algorithm: str = "adam") -> None: ...
    @staticmethod
    def fresh(family: str, mean: ArrayLike, log_var: ArrayLike, seed: int = 0) -> AttentionOptimizerState: ...
    family: str
    mean: npt.NDArray[np.float64]
    log_var: npt.NDArray[np.float64]
    mean_first_moment: npt.NDArray[np.float64]
    mean_second_moment: npt.NDArray[np.float64]
    log_var_first_moment: npt.NDArray[np.float64]
    log_var_second_moment: npt.NDArray[np.float64]
    iteration: int
    seed: int
    schema_version: int
    algorithm: str
    def to_dict(self) -> dict[str, Any]: ...
    @staticmethod
    def from_dict(d: dict[str, Any]) -> AttentionOptimizerState: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...

# ---- variational embedding attention ------------------------------------------------------------------------------

VeaObservation = tuple[npt.NDArray[np.int64], int, int]
# value() ends with the optimizer state's to_dict() form (or None); from_value and combine also take the object.
VeaValue = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64],
                 float, float, dict[str, Any] | None]

class VariationalEmbeddingAttentionDistribution(Distribution):
    def __init__(self, mean: ArrayLike, log_var: ArrayLike, emission: ArrayLike, position_prior: ArrayLike,
                 sigma2: float = 0.5, name: str | None = None,
                 optimizer_state: AttentionOptimizerState | dict[str, Any] | None = None, *,
                 precision: Literal["float64", "mixed"] = "float64") -> None: ...
    mean: npt.NDArray[np.float64]
    log_var: npt.NDArray[np.float64]
    emission: npt.NDArray[np.float64]
    position_prior: npt.NDArray[np.float64]
    sigma2: float
    name: str | None
    optimizer_state: AttentionOptimizerState
    num_symbols: int
    context_length: int
    embed_dim: int
    num_targets: int
    precision: Literal["float64", "mixed"]
    def embeddings(self) -> npt.NDArray[np.float64]: ...
    def predict_proba(self, context: ArrayLike, query_symbols: ArrayLike) -> npt.NDArray[np.float64]: ...
    def sampler(self, seed: RngLike = None) -> VariationalEmbeddingAttentionSampler: ...
    def posterior_predictive_sampler(self, seed: RngLike = None) -> VariationalEmbeddingAttentionSampler: ...
    def estimator(self, pseudo_count: float | None = None) -> VariationalEmbeddingAttentionEstimator: ...
    def dist_to_encoder(self) -> VariationalEmbeddingAttentionDataEncoder: ...

class VariationalEmbeddingAttentionSampler:
    def __init__(self, dist: VariationalEmbeddingAttentionDistribution, seed: RngLike = None) -> None: ...
    dist: VariationalEmbeddingAttentionDistribution
    @overload
    def sample(self, size: None = None, *, batched: bool = True) -> VeaObservation: ...
    @overload
    def sample(self, size: int, *, batched: bool = True) -> list[VeaObservation]: ...

# >>> generated: VariationalEmbeddingAttentionEstimator (scripts/generate_stubs.py)
class VariationalEmbeddingAttentionEstimator(Estimator):
    def __init__(
        self,
        num_symbols: int,
        context_length: int,
        embed_dim: int,
        num_targets: int,
        *,
        sigma2: float = 0.5,
        emission_smoothing: float = 0.0001,
        lr: float = 0.05,
        mc: int = 6,
        prior_strength: float = 1.0,
        precision: Literal["float64", "mixed"] = 'float64',
        seed: int = 0,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    num_symbols: int
    context_length: int
    embed_dim: int
    num_targets: int
    sigma2: float
    emission_smoothing: float
    lr: float
    mc: int
    prior_strength: float
    precision: Literal["float64", "mixed"]
    seed: int
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> VariationalEmbeddingAttentionAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> VariationalEmbeddingAttentionDistribution: ...
# <<< generated: VariationalEmbeddingAttentionEstimator

class VariationalEmbeddingAttentionAccumulator(Accumulator):
    def __init__(self, num_symbols: int, context_length: int, embed_dim: int, num_targets: int, mc: int = 6,
                 keys: str | None = None, name: str | None = None) -> None: ...
    num_symbols: int
    context_length: int
    embed_dim: int
    num_targets: int
    mc: int
    # The statistics as attributes (read-only copies, as in value()).
    @property
    def grad_m(self) -> npt.NDArray[np.float64]: ...
    @property
    def grad_logv(self) -> npt.NDArray[np.float64]: ...
    @property
    def emission_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def position_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def ll(self) -> float: ...
    @property
    def n(self) -> float: ...
    def value(self) -> VeaValue: ...

class VariationalEmbeddingAttentionAccumulatorFactory(AccumulatorFactory):
    def __init__(self, num_symbols: int, context_length: int, embed_dim: int, num_targets: int, mc: int = 6,
                 keys: str | None = None, name: str | None = None) -> None: ...
    num_symbols: int
    context_length: int
    embed_dim: int
    num_targets: int
    mc: int
    def make(self) -> VariationalEmbeddingAttentionAccumulator: ...

class VariationalEmbeddingAttentionDataEncoder(DataEncoder):
    def __init__(self, num_symbols: int | None = None, context_length: int | None = None,
                 num_targets: int | None = None) -> None: ...
    num_symbols: int | None
    context_length: int | None
    num_targets: int | None

# ---- variational multi-hop attention ------------------------------------------------------------------------------

VmhaValue = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], float, float,
                  dict[str, Any] | None]

class VariationalMultiHopAttentionDistribution(Distribution):
    def __init__(self, mean: ArrayLike, log_var: ArrayLike, emission: ArrayLike, sigma2: float = 0.3,
                 name: str | None = None,
                 optimizer_state: AttentionOptimizerState | dict[str, Any] | None = None) -> None: ...
    mean: npt.NDArray[np.float64]
    log_var: npt.NDArray[np.float64]
    emission: npt.NDArray[np.float64]
    sigma2: float
    name: str | None
    optimizer_state: AttentionOptimizerState
    num_symbols: int
    embed_dim: int
    num_targets: int
    def embeddings(self) -> npt.NDArray[np.float64]: ...
    def predict_proba(self, context_keys: ArrayLike, context_values: ArrayLike, query_symbols: ArrayLike
                      ) -> npt.NDArray[np.float64]: ...
    def sampler(self, seed: RngLike = None, *, context_length: int = 6) -> VariationalMultiHopAttentionSampler: ...
    def posterior_predictive_sampler(self, seed: RngLike = None, *, context_length: int = 6
                                     ) -> VariationalMultiHopAttentionSampler: ...
    def estimator(self, pseudo_count: float | None = None) -> VariationalMultiHopAttentionEstimator: ...
    def dist_to_encoder(self) -> VariationalMultiHopAttentionDataEncoder: ...

class VariationalMultiHopAttentionSampler:
    def __init__(self, dist: VariationalMultiHopAttentionDistribution, seed: RngLike = None, *,
                 context_length: int = 6) -> None: ...
    dist: VariationalMultiHopAttentionDistribution
    @overload
    def sample(self, size: None = None, *, batched: bool = True) -> CaObservation: ...
    @overload
    def sample(self, size: int, *, batched: bool = True) -> list[CaObservation]: ...

# >>> generated: VariationalMultiHopAttentionEstimator (scripts/generate_stubs.py)
class VariationalMultiHopAttentionEstimator(Estimator):
    def __init__(
        self,
        num_symbols: int,
        embed_dim: int,
        num_targets: int,
        *,
        sigma2: float = 0.3,
        emission_smoothing: float = 0.0001,
        lr: float = 0.05,
        mc: int = 5,
        prior_strength: float = 0.1,
        anneal_iters: int = 100,
        seed: int = 0,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    num_symbols: int
    embed_dim: int
    num_targets: int
    sigma2: float
    emission_smoothing: float
    lr: float
    mc: int
    prior_strength: float
    anneal_iters: int
    seed: int
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> VariationalMultiHopAttentionAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> VariationalMultiHopAttentionDistribution: ...
# <<< generated: VariationalMultiHopAttentionEstimator

class VariationalMultiHopAttentionAccumulator(Accumulator):
    def __init__(self, num_symbols: int, embed_dim: int, num_targets: int, mc: int = 5, keys: str | None = None,
                 name: str | None = None) -> None: ...
    num_symbols: int
    embed_dim: int
    num_targets: int
    mc: int
    # The statistics as attributes (read-only copies, as in value()).
    @property
    def grad_m(self) -> npt.NDArray[np.float64]: ...
    @property
    def grad_logv(self) -> npt.NDArray[np.float64]: ...
    @property
    def emission_count(self) -> npt.NDArray[np.float64]: ...
    @property
    def ll(self) -> float: ...
    @property
    def n(self) -> float: ...
    def value(self) -> VmhaValue: ...

class VariationalMultiHopAttentionAccumulatorFactory(AccumulatorFactory):
    def __init__(self, num_symbols: int, embed_dim: int, num_targets: int, mc: int = 5, keys: str | None = None,
                 name: str | None = None) -> None: ...
    num_symbols: int
    embed_dim: int
    num_targets: int
    mc: int
    def make(self) -> VariationalMultiHopAttentionAccumulator: ...

class VariationalMultiHopAttentionDataEncoder(DataEncoder):
    def __init__(self, num_symbols: int | None = None, num_targets: int | None = None) -> None: ...
    num_symbols: int | None
    num_targets: int | None

# ---- mixture, composite and classical leaves ----------------------------------------------------------------------

class MixtureDistribution(Distribution):
    def __init__(self, components: Sequence[Distribution], w: ArrayLike, name: str | None = None) -> None: ...
    w: npt.NDArray[np.float64]
    components: list[Distribution]
    num_components: int
    name: str | None
    def seq_posterior(self, x: Data) -> npt.NDArray[np.float64]: ...
    def sampler(self, seed: RngLike = None, **options: Any) -> MixtureSampler: ...

class MixtureSampler:
    def __init__(self, dist: MixtureDistribution, seed: RngLike = None, **options: Any) -> None: ...
    dist: MixtureDistribution
    @overload
    def sample(self, size: None = None, *, batched: bool = True) -> Observation: ...
    @overload
    def sample(self, size: int, *, batched: bool = True) -> list[Observation]: ...

class MixtureEstimator(Estimator):
    def __init__(self, estimators: Sequence[Estimator], pseudo_count: float | None = None, keys: str | None = None,
                 name: str | None = None) -> None: ...

class MixtureAccumulator(Accumulator):
    def __init__(self, accumulators: Sequence[Accumulator], keys: str | None = None,
                 name: str | None = None) -> None: ...
    accumulators: list[Accumulator]

class MixtureDataEncoder(DataEncoder):
    def __init__(self, encoder: DataEncoder) -> None: ...
    encoder: DataEncoder

class CompositeDistribution(Distribution):
    def __init__(self, dists: Sequence[Distribution], name: str | None = None) -> None: ...
    dists: list[Distribution]
    name: str | None
    def sampler(self, seed: RngLike = None) -> CompositeSampler: ...

class CompositeSampler:
    def __init__(self, dist: CompositeDistribution, seed: RngLike = None) -> None: ...
    dist: CompositeDistribution
    @overload
    def sample(self, size: None = None, *, batched: bool = True) -> tuple[Observation, ...]: ...
    @overload
    def sample(self, size: int, *, batched: bool = True) -> list[tuple[Observation, ...]]: ...

class CompositeEstimator(Estimator):
    def __init__(self, estimators: Sequence[Estimator], pseudo_count: float | None = None, keys: str | None = None,
                 name: str | None = None) -> None: ...

class CompositeAccumulator(Accumulator):
    def __init__(self, accumulators: Sequence[Accumulator], keys: str | None = None,
                 name: str | None = None) -> None: ...
    accumulators: list[Accumulator]

class CompositeDataEncoder(DataEncoder):
    def __init__(self, encoders: Sequence[DataEncoder]) -> None: ...
    encoders: list[DataEncoder]

class CategoricalDistribution(Distribution):
    def __init__(self, p: ArrayLike, name: str | None = None) -> None: ...
    p: npt.NDArray[np.float64]
    num_categories: int
    name: str | None
    def sampler(self, seed: RngLike = None) -> CategoricalSampler: ...

class CategoricalSampler:
    def __init__(self, dist: CategoricalDistribution, seed: RngLike = None) -> None: ...
    dist: CategoricalDistribution
    def sample(self, size: int | None = None, *, batched: bool = True) -> int | list[int]: ...

# >>> generated: CategoricalEstimator (scripts/generate_stubs.py)
class CategoricalEstimator(Estimator):
    def __init__(
        self,
        num_categories: int,
        *,
        smoothing: float = 0.0,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    num_categories: int
    smoothing: float
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> CategoricalAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> CategoricalDistribution: ...
# <<< generated: CategoricalEstimator

class CategoricalAccumulator(Accumulator):
    def __init__(self, num_categories: int, keys: str | None = None, name: str | None = None) -> None: ...
    num_categories: int
    # The statistics as attributes (read-only copies, as in value()).
    @property
    def counts(self) -> npt.NDArray[np.float64]: ...
    def value(self) -> tuple[npt.NDArray[np.float64]]: ...

class CategoricalAccumulatorFactory(AccumulatorFactory):
    def __init__(self, num_categories: int, keys: str | None = None, name: str | None = None) -> None: ...
    num_categories: int
    def make(self) -> CategoricalAccumulator: ...

class CategoricalDataEncoder(DataEncoder):
    def __init__(self, num_categories: int | None = None) -> None: ...
    num_categories: int | None

class DiagonalGaussianDistribution(Distribution):
    def __init__(self, mu: ArrayLike, sigma2: ArrayLike, name: str | None = None) -> None: ...
    mu: npt.NDArray[np.float64]
    sigma2: npt.NDArray[np.float64]
    dim: int
    name: str | None
    def sampler(self, seed: RngLike = None) -> DiagonalGaussianSampler: ...

class DiagonalGaussianSampler:
    def __init__(self, dist: DiagonalGaussianDistribution, seed: RngLike = None) -> None: ...
    dist: DiagonalGaussianDistribution
    def sample(self, size: int | None = None, *, batched: bool = True
               ) -> npt.NDArray[np.float64] | list[npt.NDArray[np.float64]]: ...

# >>> generated: DiagonalGaussianEstimator (scripts/generate_stubs.py)
class DiagonalGaussianEstimator(Estimator):
    def __init__(
        self,
        dim: int,
        *,
        min_sigma2: float = 1e-06,
        pseudo_count: float | None = None,
        name: str | None = None,
        keys: str | None = None,
    ) -> None: ...
    dim: int
    min_sigma2: float
    name: str | None
    keys: str | None
    def accumulator_factory(self) -> DiagonalGaussianAccumulatorFactory: ...
    def estimate(self, nobs: float | None, value: Any) -> DiagonalGaussianDistribution: ...
# <<< generated: DiagonalGaussianEstimator

class DiagonalGaussianAccumulator(Accumulator):
    def __init__(self, dim: int, keys: str | None = None, name: str | None = None) -> None: ...
    dim: int
    # The statistics as attributes (read-only copies, as in value()).
    @property
    def sum(self) -> npt.NDArray[np.float64]: ...
    @property
    def sum_sq(self) -> npt.NDArray[np.float64]: ...
    @property
    def count(self) -> float: ...
    def value(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]: ...

class DiagonalGaussianAccumulatorFactory(AccumulatorFactory):
    def __init__(self, dim: int, keys: str | None = None, name: str | None = None) -> None: ...
    dim: int
    def make(self) -> DiagonalGaussianAccumulator: ...

class DiagonalGaussianDataEncoder(DataEncoder):
    def __init__(self, dim: int | None = None) -> None: ...
    dim: int | None

# ---- inference and model files -----------------------------------------------------------------------------------

def optimize(data: Data, estimator: Estimator, max_its: int = 10, delta: float | None = 1e-9, init_p: float = 0.1,
             rng: RngLike = None, prev_estimate: Distribution | None = None, vdata: Data | None = None,
             out: TextIO | None = ..., print_iter: int = 1, reuse_estep_ll: bool = True,
             num_threads: int | None = None, *, history: list[dict[str, Any]] | None = None) -> Distribution: ...
def score(dist: Distribution, data: Data, *, num_threads: int | None = None) -> float: ...
def save_model(dist: Distribution, path: str | PathLike[str]) -> None: ...
def load_model(path: str | PathLike[str]) -> Distribution: ...
def _raise(kind: str, message: str, rows: Sequence[int] = ..., error_number: int = ...) -> None: ...

# ---- assignment-tree attention: the submodule _core.assign, re-exported as attnmix.assign ------------------------

class _AssignModule:
    """The type of ``_core.assign`` (a pybind11 submodule; attnmix/assign.py re-exports its functions)."""
    @staticmethod
    def linear_sum_assignment(cost: ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    @staticmethod
    def assignment_sample(cost: ArrayLike, tau: float, rng: RngLike) -> list[tuple[int, int]]: ...
    @staticmethod
    def frequency_estimate(cost: ArrayLike, tau: float, K: int, rng: RngLike) -> npt.NDArray[np.float64]: ...
    @staticmethod
    def kruskal_tree(score: ArrayLike) -> npt.NDArray[np.bool_]: ...
    @staticmethod
    def assignment_tree(cost: ArrayLike, tau: float, K: int, rng: RngLike
                        ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.float64]]: ...
    @overload
    @staticmethod
    def sparse_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, tree_freq: ArrayLike, alpha: float = 1.0,
                         eps: float = 1e-6, *, return_report: bool = False
                         ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    @overload
    @staticmethod
    def sparse_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, tree_freq: ArrayLike, alpha: float = 1.0,
                         eps: float = 1e-6, *, return_report: bool
                         ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], dict[str, list[int]]]: ...
    @staticmethod
    def dense_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike
                        ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    @staticmethod
    def zero_frequency_tree_edges(tree: ArrayLike, freq: ArrayLike) -> int: ...
    @staticmethod
    def run_assignment_tree_experiment(seed: int = 1234) -> dict[str, Any]: ...

assign: _AssignModule
