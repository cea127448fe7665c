"""Differential-privacy accounting and helpers (dp_accounting based)."""

from fedveil.privacy.calibration import calibrate, calibrate_noise, calibrate_noise_schedule  # noqa: F401
from fedveil.privacy.composition import DEFAULT_ORDERS, MRMTL_ORDERS, Accountant, epsilon, schedule_epsilon  # noqa: F401
from fedveil.privacy.events import Release, gaussian_std  # noqa: F401
from fedveil.privacy.events import gaussian_steps_release, report_noisy_max_release  # noqa: F401
from fedveil.privacy.ledger import PrivacyLedger  # noqa: F401
from fedveil.privacy.relations import Sampling, sampling_relation  # noqa: F401
from fedveil.privacy.zcdp import epsilon_from_rho, rho_from_epsilon_delta  # noqa: F401
from fedveil.privacy.zcdp import budget_from_epsilon_delta, budget_from_rho, rho_from_budget  # noqa: F401
from fedveil.privacy.zcdp import epsilon_from_budget, gaussian_rho  # noqa: F401
