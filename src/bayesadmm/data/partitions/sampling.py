"""Generator-aware Gamma and Dirichlet sampling.

Neither ``torch.distributions.Dirichlet.sample`` nor ``torch._standard_gamma``
takes a generator, so :func:`sample_gamma` implements Marsaglia and Tsang's
(2000) rejection sampler on top of ``torch.randn``/``torch.rand(generator=...)``,
in float64 on the CPU.
"""

from __future__ import annotations

import torch

from bayesadmm.data.partitions._checks import _F64, _check_generator


def _log_gamma_variates(concentration: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    r"""log G with G ~ Gamma(a, 1) elementwise, by Marsaglia and Tsang (2000).

    For a >= 1, with d = a - 1/3 and c = 1/sqrt(9d): draw x ~ N(0, 1) and
    u ~ U(0, 1), set v = (1 + c x)^3, and accept d v when v > 0 and
    log u < x^2/2 + d (1 - v + log v); the density of accepted d v is exactly
    Gamma(a, 1) (acceptance rate > 0.95 for all a >= 1).  For a < 1 the
    sampler is run with a + 1 and "boosted": G_a = G_{a+1} U^{1/a},
    U ~ U(0, 1], since Beta(a, 1) x Gamma(a + 1) = Gamma(a).

    The result is returned as a logarithm because U^{1/a} underflows to 0 for
    small a (a = 0.01 and U = 1e-4 give 1e-400): in log space a Dirichlet is
    a softmax and stays well defined for any a > 0.

    Rejected elements are redrawn together in vectorised rounds until all are
    accepted; the number and order of draws depend only on the generator's
    state, so the result is reproducible.
    """
    a = concentration.to(_F64)
    boost = a < 1
    d = torch.where(boost, a + 1, a) - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    flat_d, flat_c = d.reshape(-1), c.reshape(-1)
    log_g = torch.empty_like(flat_d)
    pending = torch.arange(flat_d.numel())
    while pending.numel() > 0:
        dd, cc = flat_d[pending], flat_c[pending]
        x = torch.randn(pending.numel(), generator=generator, dtype=_F64)
        u = torch.rand(pending.numel(), generator=generator, dtype=_F64)
        v = (1.0 + cc * x) ** 3
        positive = v > 0
        log_v = torch.log(torch.where(positive, v, torch.ones_like(v)))
        accept = positive & (torch.log(u) < 0.5 * x * x + dd * (1.0 - v + log_v))
        log_g[pending[accept]] = torch.log(dd[accept]) + log_v[accept]
        pending = pending[~accept]
    log_g = log_g.reshape(a.shape)
    if bool(boost.any()):
        # 1 - rand() lies in (0, 1], so log U is finite.
        u = 1.0 - torch.rand(a.shape, generator=generator, dtype=_F64)
        log_g = torch.where(boost, log_g + torch.log(u) / a, log_g)
    return log_g


def _as_concentration(concentration) -> torch.Tensor:
    conc = torch.as_tensor(concentration, dtype=_F64)
    if not bool(torch.isfinite(conc).all()) or not bool((conc > 0).all()):
        raise ValueError("concentration parameters must be positive and finite")
    return conc


def sample_gamma(concentration, generator: torch.Generator) -> torch.Tensor:
    r"""Draw G ~ Gamma(a, 1) for every element a of ``concentration``.

    The density is p(g) = g^{a-1} e^{-g} / Gamma(a), with mean a and
    variance a.  Marsaglia and Tsang's rejection sampler (with the
    G_a = G_{a+1} U^{1/a} boost for a < 1) driven only by ``generator``, so
    unlike ``torch.distributions.Gamma`` it is reproducible without touching
    the global RNG.  Scale by theta for Gamma(a, theta).

    Args:
        concentration: positive shape parameters a (any shape).
        generator: the only source of randomness.

    Returns:
        float64 tensor of the shape of ``concentration``.  For very small a
        (below about 0.01) values may underflow to 0; :func:`sample_dirichlet`
        avoids this by working with logarithms.
    """
    return torch.exp(_log_gamma_variates(_as_concentration(concentration), _check_generator(generator)))


def _log_dirichlet(concentration: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Log of a Dirichlet draw along the last axis (a log-softmax of log-Gammas)."""
    return torch.log_softmax(_log_gamma_variates(concentration, generator), dim=-1)


def sample_dirichlet(concentration, generator: torch.Generator) -> torch.Tensor:
    r"""Draw p ~ Dir(a) along the last axis of ``concentration``.

    p_i = G_i / sum_j G_j with independent G_i ~ Gamma(a_i, 1), computed as a
    softmax of log G so that small a do not give 0/0.  Leading axes are
    independent draws.

    Returns:
        float64 tensor of the shape of ``concentration``, non-negative, summing
        to 1 along the last axis.
    """
    conc = _as_concentration(concentration)
    if conc.ndim == 0:
        raise ValueError("a Dirichlet concentration needs at least one axis")
    return torch.exp(_log_dirichlet(conc, _check_generator(generator)))
