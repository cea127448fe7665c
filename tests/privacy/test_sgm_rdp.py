"""The vectorised Poisson-subsampled Gaussian RDP equals dp_accounting's loop version."""
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.sgm_rdp import poisson_gaussian_rdp

SPEC_ORDERS = tuple([1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5] + list(range(5, 64)) + [128, 256, 512])


def reference(q, z, orders):
    acc = rdp_privacy_accountant.RdpAccountant(list(orders), NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), 1)
    return acc._rdp


@pytest.mark.parametrize("q, z", [(0.16, 3.72), (0.0734, 50.9), (0.0331, 18.11), (0.01, 1.1), (0.5, 0.7), (1.0, 9.28), (0.3, 0.2)])
@pytest.mark.parametrize("orders", [DEFAULT_ORDERS, SPEC_ORDERS], ids=["default", "spec"])
def test_matches_dp_accounting(q, z, orders):
    want, got = reference(q, z, orders), poisson_gaussian_rdp(q, z, orders)
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-10, atol=1e-14)
