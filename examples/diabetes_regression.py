"""Exact federated Bayesian linear regression in one round: BayesADMM with full-covariance Gaussians.

The data are scikit-learn's bundled diabetes set (442 patients, 10 features, a disease-progression score), split over
clients by BMI so that every client sees a different part of the input space. The model is y ~ N(zᵀθ, σ²) with
z = (x, 1) and the prior θ ~ N(0, δ⁻¹I), so the posterior of all the data pooled is Gaussian in closed form:

    Σ* = (ZᵀZ/σ² + δI)⁻¹,   m* = Σ* Zᵀy/σ².

BayesADMM with the full-covariance family, exact (Newton) client solves, ρ = 1/K and the server starting at the
prior reaches exactly this posterior after ONE round (Prop. D.1 of the BayesADMM paper): each client's loss is
quadratic, so its natural-parameter message is exact, and with ρ = 1/K the server's update adds them up exactly.
The script checks this against the closed form and reports how well calibrated the predictive intervals are on a
held-out split.

    python examples/diabetes_regression.py [--small] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

import torch
from sklearn.datasets import load_diabetes
from torch import Tensor, nn

import bayesadmm
from bayesadmm.algorithms import bayes_admm
from bayesadmm.families import FullGaussian
from bayesadmm.problems.losses import QuadraticLoss, ridge_loss
from bayesadmm.solvers.von import VON

DTYPE = torch.float64     # the exactness check compares to ~1e-10: everything in double precision
NUM_CLIENTS = 5
PRIOR_PRECISION = 1.0     # δ: standardised features and targets, so weights of order one are a priori plausible


@dataclass(frozen=True)
class GaussianClient:
    """One client's negative log-likelihood ℓ_k(θ) = ½‖Z_kθ − y_k‖²/σ² (constants dropped), in the two forms the
    library's solvers use: value/grad/hess for the Newton solver, and `batch_loss` (the mean over some examples),
    which is what makes it a `bayesadmm.ClientData` that `bayesadmm.run` accepts as a ready client."""

    Z: Tensor
    y: Tensor
    noise: float
    quadratic: QuadraticLoss

    @classmethod
    def from_data(cls, Z: Tensor, y: Tensor, noise: float) -> GaussianClient:
        # ridge_loss is ½‖Zθ − y‖²; dividing Z and y by σ makes it the Gaussian NLL with noise σ
        return cls(Z, y, noise, ridge_loss(Z / noise, y / noise))

    @property
    def num_examples(self) -> int:
        return self.y.shape[0]

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        return (0.5 * ((self.Z[idx] @ theta - self.y[idx]) / self.noise).square()).mean()

    # what the Newton solver (solvers.von.DeltaVON) calls
    def value(self, theta: Tensor) -> Tensor:
        return self.quadratic.value(theta)

    def grad(self, theta: Tensor) -> Tensor:
        return self.quadratic.grad(theta)

    def hess(self, theta: Tensor) -> Tensor:
        return self.quadratic.hess(theta)

    def hess_diag(self, theta: Tensor) -> Tensor:
        return self.quadratic.hess_diag(theta)


def load_data(seed: int = 0):
    """Standardised train/test splits (statistics of the training part only) and the design matrices Z = [X, 1]."""
    X, y = load_diabetes(return_X_y=True)
    X, y = torch.tensor(X, dtype=DTYPE), torch.tensor(y, dtype=DTYPE)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, train = order[: len(y) // 5], order[len(y) // 5:]
    x_mean, x_std, y_mean, y_std = X[train].mean(0), X[train].std(0), y[train].mean(), y[train].std()
    X, y = (X - x_mean) / x_std, (y - y_mean) / y_std
    ones = torch.ones(len(y), 1, dtype=DTYPE)
    # nn.Linear(d, 1) flattens to θ = (weight₁…weight_d, bias), so the column of ones goes last
    Z = torch.cat([X, ones], dim=1)
    return (X[train], Z[train], y[train]), (X[test], y[test])


def main(small: bool = False, out: str = "runs/examples/diabetes_regression") -> dict:
    (X, Z, y), test = load_data()
    n, p = Z.shape

    # σ: the residual standard deviation of the least-squares fit to the training data (n − p degrees of freedom).
    # Computed on the pooled data for brevity; in a federation it needs only each client's ZᵀZ, Zᵀy and yᵀy.
    theta_ls = torch.linalg.lstsq(Z, y[:, None]).solution[:, 0]
    noise = float(((y - Z @ theta_ls).square().sum() / (n - p)).sqrt())

    # heterogeneous clients: contiguous blocks of patients sorted by BMI (feature 2)
    blocks = torch.argsort(X[:, 2]).tensor_split(NUM_CLIENTS)
    clients = [GaussianClient.from_data(Z[idx], y[idx], noise) for idx in blocks]

    # The server starts at the prior N(0, δ⁻¹I): BayesADMM's server starts at mean θ0 (the model's initial
    # parameters) and precision δ, so the model starts at zero.
    model = nn.Linear(p - 1, 1, dtype=DTYPE)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)

    # BayesADMM over full-covariance Gaussians with Newton client solves (VON with the delta method: Newton's method
    # on the client subproblem, exact in one step on a quadratic loss); the family and the solver are objects, so
    # the factory is a partial of bayes_admm.make and the numbers go in as hyperparameters.
    factory = functools.partial(bayes_admm.make, FullGaussian(p), VON(expectation="delta"))
    result = bayesadmm.run(model, clients, test, algorithm=factory,
                           hparams={"rho": 1.0 / NUM_CLIENTS, "delta": PRIOR_PRECISION, "name": "bayes-admm-full"},
                           likelihood=bayesadmm.GaussianRegression(noise=noise), rounds=1,
                           eval_samples=200 if small else 2000, progress=False, out=out)

    # the closed-form posterior of all the training data pooled
    precision = Z.T @ Z / noise**2 + PRIOR_PRECISION * torch.eye(p, dtype=DTYPE)
    cov_star = torch.linalg.inv(precision)
    mean_star = cov_star @ (Z.T @ y) / noise**2
    mean_err = float((result.posterior.mean - mean_star).abs().max())
    cov_err = float((torch.linalg.inv(result.posterior.precision) - cov_star).abs().max())

    line = result.history[-1]
    print(f"diabetes: {n} training patients over {NUM_CLIENTS} clients (sizes {[len(b) for b in blocks]}), "
          f"{len(test[1])} held out; noise σ = {noise:.4f} (least-squares residuals)")
    print(f"run {result.status} after {result.round} round; posterior vs the closed form of the pooled data:")
    print(f"  max |mean − m*| = {mean_err:.2e}   max |cov − Σ*| = {cov_err:.2e}   (largest |m*| = "
          f"{float(mean_star.abs().max()):.3f}, largest Σ*_ij = {float(cov_star.abs().max()):.2e})")
    print("held-out predictive (standardised units):")
    print(f"  at the posterior mean:  rmse {line['test_rmse']:.4f}  nll {line['test_nll']:.4f}  "
          f"90% interval coverage {line['test_coverage90']:.3f}  calibration error "
          f"{line['test_calibration_error']:.3f}")
    print(f"  posterior predictive:   rmse {line['ens_test_rmse']:.4f}  nll {line['ens_test_nll']:.4f}  "
          f"90% interval coverage {line['ens_test_coverage90']:.3f}  calibration error "
          f"{line['ens_test_calibration_error']:.3f}")
    # one round of BayesADMM is the exact posterior, up to rounding
    assert mean_err < 1e-10 and cov_err < 1e-10, (mean_err, cov_err)
    return {"result": result, "mean_error": mean_err, "cov_error": cov_err, "noise": noise}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="CI settings (fewer predictive samples)")
    parser.add_argument("--out", default="runs/examples/diabetes_regression", help="the run directory")
    args = parser.parse_args()
    main(small=args.small, out=args.out)
