"""Closed-form theory from the seed papers, used to check the simulations and reproductions.

:mod:`fedveil.theory.mean_estimation`: MR-MTL for private federated mean estimation
(Liu, thesis §1.6, App. D-E; spec 002 §3).
:mod:`fedveil.theory.gd_risk_bounds`: expected risk upper bounds of private GD under uniform
and dynamic noise schedules, and the number of steps minimising them (Hong, dissertation Ch. 2).
:mod:`fedveil.theory.fade_analysis`: FADE's optimal discriminator and expected discrepancy on
discrete distributions, and its minimum at balanced groups (Hong, dissertation §3.4).
"""
from .fade_analysis import balanced_minimum, discrepancy, optimal_discriminator, squared_discrepancy
from .gd_risk_bounds import (
    best_T_dynamic,
    best_T_uniform,
    closed_form_T_dynamic,
    closed_form_T_uniform,
    erub_dynamic,
    erub_uniform,
)
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
    "balanced_minimum",
    "discrepancy",
    "optimal_discriminator",
    "squared_discrepancy",
    "best_T_dynamic",
    "best_T_uniform",
    "closed_form_T_dynamic",
    "closed_form_T_uniform",
    "erub_dynamic",
    "erub_uniform",
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
