"""Differential-privacy accounting and helpers (dp_accounting based)."""

from fedveil.privacy.accounting import DEFAULT_ORDERS, MRMTL_ORDERS  # noqa: F401
from fedveil.privacy.accounting import PrivacyLedger, Release  # noqa: F401
from fedveil.privacy.accounting import calibrate_noise, epsilon, gaussian_std  # noqa: F401
from fedveil.privacy.accounting import calibrate_noise_schedule, schedule_epsilon  # noqa: F401
from fedveil.privacy.accounting import gaussian_steps_release, report_noisy_max_release  # noqa: F401
from fedveil.privacy.accounting import sampling_relation  # noqa: F401
from fedveil.privacy.zcdp import epsilon_from_rho, rho_from_epsilon_delta  # noqa: F401
from fedveil.privacy.zcdp import budget_from_epsilon_delta, budget_from_rho, rho_from_budget  # noqa: F401
from fedveil.privacy.zcdp import epsilon_from_budget, gaussian_rho  # noqa: F401
