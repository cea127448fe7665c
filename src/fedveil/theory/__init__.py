"""Closed-form theory from the seed papers, used to check the simulations and reproductions.

:mod:`fedveil.theory.mean_estimation`: MR-MTL for private federated mean estimation
(Liu, thesis §1.6, App. D-E; spec 002 §3).
"""
from .mean_estimation import (
    MonteCarloErrors,
    fedavg_error,
    fedavg_gap,
    gaussian_sigma_dp,
    local_error,
    local_gap,
    local_variance,
    local_weight,
    mrmtl_error,
    mrmtl_estimates,
    optimal_error,
    optimal_lambda,
    per_silo_mrmtl_errors,
    per_silo_optimal_lambdas,
    privacy_cost,
    simulate_mean_estimation,
    tnb_expected_runs,
    tnb_gamma,
    tnb_tuning_rdp,
    tuned_gaussian_sigma_dp,
)

__all__ = [
    "MonteCarloErrors",
    "fedavg_error",
    "fedavg_gap",
    "gaussian_sigma_dp",
    "local_error",
    "local_gap",
    "local_variance",
    "local_weight",
    "mrmtl_error",
    "mrmtl_estimates",
    "optimal_error",
    "optimal_lambda",
    "per_silo_mrmtl_errors",
    "per_silo_optimal_lambdas",
    "privacy_cost",
    "simulate_mean_estimation",
    "tnb_expected_runs",
    "tnb_gamma",
    "tnb_tuning_rdp",
    "tuned_gaussian_sigma_dp",
]
