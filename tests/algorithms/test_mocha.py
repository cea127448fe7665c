"""MOCHA primal (spec 002 §2.6): the coupling gradient and the task-covariance update."""
import numpy as np
import scipy.linalg
import torch

from fedveil import params as P
from fedveil.algorithms.mocha import task_covariance
from harness import assert_params_close, full_batch_grad, initial_params, make_algorithm, run_rounds


def test_sigma_is_the_normalised_square_root_of_w_w_transpose():
    gen = torch.Generator().manual_seed(0)
    models = [{"a": torch.randn(4, 3, generator=gen, dtype=torch.float64), "b": torch.randn(2, generator=gen, dtype=torch.float64)}
              for _ in range(3)]
    flat = np.stack([np.r_[m["a"].numpy().ravel(), m["b"].numpy()] for m in models])
    root = scipy.linalg.sqrtm(flat @ flat.T).real
    np.testing.assert_allclose(task_covariance(models).numpy(), root / np.trace(root), atol=1e-10)


def test_first_rounds_by_hand():
    lam, l2, lr = 0.6, 0.05, 0.1
    alg = make_algorithm("mocha", lam=lam, l2=l2, client={"batch_size": 0, "steps": 1, "lr": lr})
    run = run_rounds(alg, 2)
    data = [c.train for c in alg.ctx.data.clients]
    k = len(data)
    w0 = initial_params(alg.ctx.model)
    # round 1: Sigma = I / K, so the coupling gradient of row k is lam w_k / K (+ l2 w_k)
    w1 = [P.add(w0, P.add(full_batch_grad(w0, d), w0, lam / k + l2), -lr) for d in data]
    sigma = task_covariance(w1)
    # round 2: lam (Sigma W)_k + l2 w_k
    w2 = []
    for i, d in enumerate(data):
        coupling = {n: sum(float(sigma[i, j]) * w1[j][n] for j in range(k)) for n in w0}
        grad = P.add(P.add(full_batch_grad(w1[i], d), coupling, lam), w1[i], l2)
        w2.append(P.add(w1[i], grad, -lr))
        assert_params_close(run.server["models"][i], w2[i])
    torch.testing.assert_close(run.server["sigma"], task_covariance(w2))
