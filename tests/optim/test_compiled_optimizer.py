"""The nn.Module optimizer's own fused kernels (optim/flat_group.py) compiled: tests/conftest.py runs IVON's kernels
eagerly in tests not marked `compiled`, which is how tests/optim/test_ivon.py runs them."""

import warnings

import pytest
import torch
from tests.optim import test_ivon

from bayesadmm import rng
from bayesadmm.optim import flat_group, kernels


@pytest.mark.compiled
def test_compiled_counter_noise_samples_are_block_after_block_of_the_stream():
    """The compiled sampling and update-and-perturb kernels of noise="counter" draw the stream's blocks in order
    (`test_ivon.test_counter_noise_samples_are_block_after_block_of_the_stream`, there with the eager kernels)."""
    test_ivon.test_counter_noise_samples_are_block_after_block_of_the_stream()


# The optimizer's kernel inputs for each combination of terms a user may leave out (`IVON._terms`): an absent prior
# mean or dual is None, δ of a weight decay 0-d. The reference is the eager maths on full vectors (zeros where absent).
ABSENT = {
    "weight-decay": dict(prior_mean=False, duals=False, delta_vector=False),
    "prior-mean": dict(prior_mean=True, duals=False, delta_vector=False),
    "duals-and-prior-precision": dict(prior_mean=False, duals=True, delta_vector=True),
}


def optimizer_kernel_inputs(case, d=1001, mc_samples=2):
    """(state, samples, the kernel's terms, the same terms as full vectors, scalars), float64."""
    g = torch.Generator().manual_seed(3)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    given = ABSENT[case]
    state = [r(d), r(d).abs() + 0.05, r(d)]
    samples = [r(mc_samples, d), r(mc_samples, d)]
    delta = r(d).abs() + 0.1 if given["delta_vector"] else torch.tensor(0.03)
    prior_mean = r(d) if given["prior_mean"] else None
    v, u = (r(d), 0.1 * r(d).abs()) if given["duals"] else (None, None)
    terms = [delta, prior_mean, v, u]
    full = [delta.expand(d).clone(), *(torch.zeros(d) if x is None else x for x in (prior_mean, v, u))]
    scalars = [torch.tensor(x) for x in (0.05, 7.0, 0.9, 0.999, 1 - 0.9**3, 0.5)]  # lr, ess, β₁, β₂, debias, clip
    return state, samples, terms, full, scalars


@pytest.mark.compiled
@pytest.mark.parametrize("case", ABSENT)
def test_compiled_update_and_perturb_without_absent_terms_gives_the_full_vectors_numbers(case):
    """The compiled variants that read no prior mean or duals where the user set none, and δ as one number: the new
    m, h, g and the next perturbation σε with its ε are the eager maths' on full vectors (kernels.update_step,
    flat_group._perturbation) to float64 rounding."""
    state, samples, terms, full, scalars = optimizer_kernel_inputs(case)
    key = rng.block_key(torch.tensor(77), 4)
    expected = kernels.update_step(*state, *samples, *full, *scalars)
    expected_perturbation, expected_eps = flat_group._perturbation(expected[1], full[0], scalars[1], key)
    written = [t.clone() for t in state]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compiler failure would fall back to eager with a warning
        perturbation, eps = flat_group._update_and_perturb_step_(*written, *samples, *terms, *scalars, key)
    for a, b in zip((*written, perturbation, eps), (*expected, expected_perturbation, expected_eps), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the sample the next sampled_params takes: m + σε as `kernels.sample_step` draws it from the same block
    thetas, _ = kernels.sample_step.eager(expected[0], expected[1], full[0], scalars[1], key, 1)
    torch.testing.assert_close(written[0] + perturbation, thetas[0], rtol=1e-12, atol=1e-12)


@pytest.mark.compiled
def test_compiled_update_without_absent_terms_gives_the_full_vectors_numbers():
    """noise="torch"'s step: `kernels.update_step_` on the optimizer's inputs without prior mean and duals."""
    state, samples, terms, full, scalars = optimizer_kernel_inputs("weight-decay")
    expected = kernels.update_step(*state, *samples, *full, *scalars)
    written = [t.clone() for t in state]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        kernels.update_step_(*written, *samples, *terms, *scalars)
    for a, b in zip(written, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
