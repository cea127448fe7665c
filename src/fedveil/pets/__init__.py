"""The PETs Prize pandemic-forecasting solution (spec 002 chapter 2) on a synthetic stand-in.

Modules: :mod:`.tables` (the §4.1 schema), :mod:`.csv_io` (its CSV files), :mod:`.synthetic`
and :mod:`.epidemic` (``synthetic_pandemic``: made-up population, contacts and outbreak),
:mod:`.graph` (contact multigraph, PageRank, deterministic neighbour sampling),
:mod:`.features` (neighbourhood vectors, random-window labels), :mod:`.focal` (focal loss),
:mod:`.logreg` (DP-SGD logistic regression), :mod:`.node_dp` (Theorem 2.4.4's node-level
epsilon, not a guarantee for this pipeline: see :mod:`.pipeline`), :mod:`.baseline`
(organisers' SIR model), :mod:`.pipeline` (centralised vs MR-MTL).
"""
from .csv_io import read_csv_tables, write_csv_tables
from .features import FeatureLayout, SiloFeatures, build_silo_features, feature_dim
from .logreg import TrainConfig
from .node_dp import node_epsilon
from .pipeline import PipelineConfig, prepare, run_centralised, run_federated, run_sir_baseline
from .synthetic import SyntheticConfig, synthetic_pandemic
from .tables import PandemicTables, split_by_region

__all__ = [
    "FeatureLayout", "PandemicTables", "PipelineConfig", "SiloFeatures", "SyntheticConfig", "TrainConfig",
    "build_silo_features", "feature_dim", "node_epsilon", "prepare", "read_csv_tables", "run_centralised",
    "run_federated", "run_sir_baseline", "split_by_region", "synthetic_pandemic", "write_csv_tables",
]
