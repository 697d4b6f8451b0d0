"""IVON's fused kernels (bayesadmm.optim.kernels) and the counter-based normal stream they draw from (bayesadmm.rng).

The kernels must compute exactly the eager maths (to rounding), the stream must be the documented SplitMix64 block
keys, 32-bit hashes and Box–Muller (checked against a pure-Python implementation in exact integers) and look like
independent standard normals.
"""

import math
import warnings

import pytest
import torch

from bayesadmm import rng
from bayesadmm.optim import ivon, kernels

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
PHI32 = 0x9E3779B9


def splitmix64_reference(key: int, j: int) -> int:
    """SplitMix64's output for state key + j·γ, in Python's exact integers (Steele, Lea & Flood 2014)."""
    z = (key + j * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def lowbias32_reference(x: int) -> int:
    """Wellons' lowbias32 hash on an unsigned 32-bit integer."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & MASK32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def normal_reference(block_key: int, n: int) -> list[float]:
    """The documented transform in exact integers and library cos/sin: pair j → (a, b) → Box–Muller."""
    k_lo, k_hi = block_key & MASK32, block_key >> 32
    pairs = (n + 1) // 2
    cos_half, sin_half = [], []
    for j in range(pairs):
        a = lowbias32_reference(lowbias32_reference((j * PHI32 + k_lo) & MASK32) ^ k_hi)
        b = lowbias32_reference((a + PHI32) & MASK32)
        r = math.sqrt(-2.0 * math.log(((a >> 8) + 0.5) * 2.0 ** -24))
        angle = (b >> 30) * math.pi / 2 + ((b & 0xFFFFFF) * 2.0 ** -24 - 0.5) * math.pi / 2
        cos_half.append(r * math.cos(angle))
        sin_half.append(r * math.sin(angle))
    return (cos_half + sin_half)[:n]


@pytest.mark.parametrize("key", [0, 12345, -(1 << 63), (1 << 63) - 1, -7])
def test_block_key_is_splitmix64_of_the_block_counter(key):
    for block in (0, 1, 1_000_003):
        expected = splitmix64_reference(key & MASK64, block + 1)
        assert int(rng.block_key(torch.tensor(key), block)) & MASK64 == expected


@pytest.mark.parametrize("key", [0, 12345, -(1 << 63), (1 << 63) - 1, -7])
def test_counter_normal_is_the_documented_hash_and_box_muller(key):
    n = 9   # odd: the last pair's sine half is dropped
    block_key = rng.block_key(torch.tensor(key), 3)
    ours = rng.counter_normal(block_key, n, torch.float64, "cpu")
    expected = torch.tensor(normal_reference(int(block_key) & MASK64, n), dtype=torch.float64)
    # the polynomial cos/sin of the definition agree with the library's to < 2e-9 (times the radius ≤ 5.9)
    torch.testing.assert_close(ours, expected, rtol=0, atol=2e-8)


def test_counter_normal_blocks_are_reproducible_and_distinct():
    key = rng.stream_key(torch.Generator().manual_seed(3))
    first = rng.counter_normal(rng.block_key(key, 0), 40, torch.float64, "cpu")
    assert torch.equal(first, rng.counter_normal(rng.block_key(key, 0), 40, torch.float64, "cpu"))
    # a shorter block is a prefix of each half: pair j does not depend on n
    short = rng.counter_normal(rng.block_key(key, 0), 20, torch.float64, "cpu")
    assert torch.equal(short[:10], first[:10]) and torch.equal(short[10:], first[20:30])
    second = rng.counter_normal(rng.block_key(key, 1), 40, torch.float64, "cpu")
    other = rng.counter_normal(rng.block_key(rng.stream_key(torch.Generator().manual_seed(4)), 0), 40,
                               torch.float64, "cpu")
    assert not torch.isclose(first, second).any() and not torch.isclose(first, other).any()
    with pytest.raises(ValueError, match="block"):
        rng.block_key(key, -1)


def test_counter_normal_looks_like_independent_standard_normals():
    n = 200_000
    z = rng.counter_normal(rng.block_key(torch.tensor(99), 0), n, torch.float64, "cpu")
    se = 1 / math.sqrt(n)
    assert abs(z.mean()) < 5 * se
    assert abs(z.var() - 1) < 5 * math.sqrt(2) * se
    assert abs((z ** 4).mean() - 3) < 5 * math.sqrt(96) * se           # Var z⁴ = 105 − 9 = 96
    # Kolmogorov–Smirnov distance to Φ; the 0.1 % critical value is 1.95/√n
    sorted_z = torch.sort(z).values
    cdf = 0.5 * (1 + torch.erf(sorted_z / math.sqrt(2)))
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    assert (grid - cdf).abs().max() < 1.95 / math.sqrt(n)
    # neighbours, and a cosine draw with its sine partner, are uncorrelated (tests the pairing as well)
    half = n // 2
    for a, b in ((z[:-1], z[1:]), (z[:half], z[half:]), (z[:half] ** 2, z[half:] ** 2)):
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1]) < 5 / math.sqrt(half)


def random_update_inputs(d, mc_samples, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    vectors = dict(mean=r(d), hess=r(d).abs(), momentum=r(d))
    samples = dict(grads=r(mc_samples, d), eps=r(mc_samples, d))
    terms = dict(delta=r(d).abs() + 0.1, prior_mean=r(d), v=r(d), u=0.1 * r(d).abs(), lr=torch.full((d,), 0.05,
                                                                                                   dtype=dtype))
    scalars = [torch.tensor(x, dtype=dtype) for x in (7.0, 0.9, 0.999, 1 - 0.9 ** 3, 0.5)]
    return [*vectors.values(), *samples.values(), *terms.values(), *scalars]


@pytest.mark.compiled
@pytest.mark.parametrize("mc_samples", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_update_equals_the_eager_maths(mc_samples, dtype):
    """The compiled (in-place) update kernels against the plain functions they are compiled from. The update with
    sampling only in the variant the solver tests use as well: each of its variants takes seconds to compile afresh
    (~45 s before kernels.INDUCTOR_CONFIG: the noise's integer code), and its sampling half is checked against the
    stream by the test below."""
    args = random_update_inputs(1000, mc_samples, dtype)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    key = rng.block_key(torch.tensor(9), 3)
    kernel_pairs = [(kernels.update_step, kernels.update_step_, ())]
    if dtype == torch.float64 and mc_samples == 1:
        kernel_pairs.append((kernels.update_and_sample_step, kernels.update_and_sample_step_, (key, mc_samples)))
    for pure, in_place, extra in kernel_pairs:
        expected = pure(*args, *extra)
        state = [t.clone() for t in args[:3]]   # mean, hess, momentum: written in place
        returned = in_place(*state, *args[3:], *extra)
        written = (*state, *(returned or ()))
        assert len(written) == len(expected)
        for a, b in zip(written, expected, strict=False):
            torch.testing.assert_close(a, b, **tol)


def test_update_leaves_out_absent_terms_with_the_bits_of_zero_vectors():
    """prior_mean, v, u None and δ 0-d (the nn.Module optimizer's inputs where its user set no prior or duals) give
    exactly the numbers of zero vectors and a constant δ vector: x − 0, x + 0 and x − 0·m are x."""
    for mc_samples in (1, 3):
        args = random_update_inputs(100, mc_samples, torch.float64)
        delta = torch.tensor(0.07)
        full = [*args[:5], delta.expand(100).clone(), *(torch.zeros(100) for _ in range(3)), *args[9:]]
        absent = [*args[:5], delta, None, None, None, *args[9:]]
        for a, b in zip(kernels.update_step(*absent), kernels.update_step(*full), strict=True):
            assert torch.equal(a, b)
        for name, index in (("prior_mean", 6), ("v", 7), ("u", 8)):   # each left out alone
            one = list(args)
            one[index] = torch.zeros(100)
            alone = list(args)
            alone[index] = None
            for a, b in zip(kernels.update_step(*alone), kernels.update_step(*one), strict=True):
                assert torch.equal(a, b), name


@pytest.mark.compiled
def test_compiled_sampling_equals_the_eager_maths_and_the_stream():
    d, S = 1001, 2
    g = torch.Generator().manual_seed(1)
    mean, hess, delta = torch.randn(d, generator=g), torch.rand(d, generator=g), torch.rand(d, generator=g)
    ess, key = torch.tensor(30.0), rng.block_key(torch.tensor(2024), 5)
    thetas, eps = kernels.sample_step(mean, hess, delta, ess, key, S)
    eager_thetas, eager_eps = kernels.sample_step.eager(mean, hess, delta, ess, key, S)
    torch.testing.assert_close(eps, eager_eps, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(thetas, eager_thetas, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(eps.reshape(-1), rng.counter_normal(key, S * d, torch.float64, "cpu"),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(thetas, mean + eps / torch.sqrt(30.0 * (hess + delta)))


def test_sample_with_a_key_draws_block_t_of_the_stream():
    """ivon.sample with a key uses block number `state.step` (so every step gets fresh noise without state)."""
    d, S = 7, 3
    key = torch.tensor(11)
    delta = torch.full((d,), 0.2)
    state = ivon.init(torch.zeros(d), 0.3)._replace(step=4)
    thetas, eps = ivon.sample(state, 10.0, delta, key, S)
    torch.testing.assert_close(eps.reshape(-1), rng.counter_normal(rng.block_key(key, 4), S * d, torch.float64,
                                                                   "cpu"))
    torch.testing.assert_close(thetas, eps / math.sqrt(10.0 * 0.5))
    _, next_eps = ivon.sample(state._replace(step=5), 10.0, delta, key, S)
    assert not torch.isclose(eps, next_eps).any()


@pytest.mark.compiled
def test_a_failing_compiler_falls_back_to_the_same_maths_with_a_warning(monkeypatch):
    def broken_compile(fn, **kwargs):
        def fail(*args):
            raise RuntimeError("no C++ compiler here")
        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    kernel = kernels.fused(kernels.update_step)
    args = random_update_inputs(50, 2)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler here"):
        first = kernel(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # warned once, then eager without a word
        second = kernel(*args)
    for a, b, c in zip(first, second, kernels.update_step(*args), strict=False):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.compiled
def test_the_kernels_get_their_own_recompile_limit_and_leave_torchs_alone(monkeypatch):
    """Up to 8 variants per kernel reach torch's default limit of 8: each kernel is compiled with a limit of its
    own (torch.compile's recompile_limit), and torch._dynamo.config is not touched."""
    calls = []

    def compile_with_a_limit(fn, *, backend="inductor", dynamic=None, fullgraph=False, recompile_limit=None):
        calls.append(dict(dynamic=dynamic, fullgraph=fullgraph, recompile_limit=recompile_limit))
        assert getattr(backend, "compiler_name", None) == "inductor"   # Inductor, under kernels.INDUCTOR_CONFIG
        return fn

    before = torch._dynamo.config.recompile_limit
    monkeypatch.setattr(torch, "compile", compile_with_a_limit)
    kernel = kernels.fused(kernels.update_step)
    args = random_update_inputs(20, 1)
    for a, b in zip(kernel(*args), kernels.update_step(*args), strict=False):
        assert torch.equal(a, b)
    assert calls == [dict(dynamic=True, fullgraph=True, recompile_limit=kernels.RECOMPILE_LIMIT)]
    assert torch._dynamo.config.recompile_limit == before


@pytest.mark.compiled
def test_where_torch_compile_takes_no_limit_the_global_one_is_raised_only_for_new_variants(monkeypatch):
    """The first call of each variant (dtype, sizes 0/1/more, non-tensor arguments) runs with the limit raised, later
    calls of a variant already run with torch's setting as it was, and nothing stays changed."""
    config = torch._dynamo.config
    before = config.recompile_limit
    limits = []

    def compile_without_a_limit(fn, **kwargs):
        assert "recompile_limit" not in kwargs

        def run(*args):
            limits.append(config.recompile_limit)
            return fn(*args)
        return run

    monkeypatch.setattr(torch, "compile", compile_without_a_limit)
    kernel = kernels.fused(kernels.update_step)
    for mc_samples, dtype in ((1, torch.float64), (1, torch.float64), (3, torch.float64), (1, torch.float32),
                              (2, torch.float64)):
        args = random_update_inputs(20, mc_samples, dtype)
        for a, b in zip(kernel(*args), kernels.update_step(*args), strict=False):
            assert torch.equal(a, b)
    raised = max(before, kernels.RECOMPILE_LIMIT)
    assert limits == [raised, before, raised, raised, before]   # 2 and 3 samples: one variant (sizes > 1 merged)
    assert config.recompile_limit == before


def test_compilation_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("BAYESADMM_COMPILE", "0")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: pytest.fail("compiled although switched off"))
    kernel = kernels.fused(kernels.update_step)
    args = random_update_inputs(50, 1)
    for a, b in zip(kernel(*args), kernels.update_step(*args), strict=False):
        assert torch.equal(a, b)


@pytest.mark.compiled
def test_inductor_compiles_the_kernels_with_their_settings_and_leaves_torchs_alone(monkeypatch):
    """kernels.INDUCTOR_CONFIG is in force while Inductor compiles a kernel (for every variant: it is part of the
    backend), and torch._inductor.config is as it was before and after."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config

    before = {key: getattr(config, key) for key in kernels.INDUCTOR_CONFIG}
    assert before != kernels.INDUCTOR_CONFIG
    seen = []

    def compile_and_record(gm, example_inputs, **kwargs):
        seen.append({key: getattr(config, key) for key in kernels.INDUCTOR_CONFIG})
        return gm.forward

    monkeypatch.setattr(compile_fx, "compile_fx", compile_and_record)
    torch._dynamo.reset()   # (compiled kernels of earlier tests would not compile again)
    kernel = kernels.fused(kernels.update_step)
    for mc_samples in (1, 2):
        args = random_update_inputs(20, mc_samples)
        for a, b in zip(kernel(*args), kernels.update_step(*args), strict=False):
            assert torch.equal(a, b)
        assert {key: getattr(config, key) for key in kernels.INDUCTOR_CONFIG} == before
    assert seen == [kernels.INDUCTOR_CONFIG] * 2
    torch._dynamo.reset()


def test_update_and_sample_equals_update_then_sample():
    g = torch.Generator().manual_seed(8)
    d, S = 501, 2
    state = ivon.IVONState(torch.randn(d, generator=g), torch.rand(d, generator=g), torch.randn(d, generator=g), 6)
    key = torch.tensor(77)
    _, eps = ivon.sample(state, 20.0, 0.1, key, S)
    grads = torch.randn(S, d, generator=g)
    terms = dict(lr=0.01, ess=20.0, delta=torch.full((d,), 0.1), beta1=0.9, beta2=0.999,
                 prior_mean=torch.randn(d, generator=g), v=torch.randn(d, generator=g), u=torch.full((d,), 0.01))
    fused_state, fused_thetas, fused_eps = ivon.update_and_sample(state, grads, eps, key, S, **terms)
    new_state = ivon.update(state, grads, eps, **terms)
    thetas, next_eps = ivon.sample(new_state, 20.0, terms["delta"], key, S)
    assert fused_state.step == new_state.step == 7
    for a, b in zip((*fused_state[:3], fused_thetas, fused_eps), (*new_state[:3], thetas, next_eps), strict=False):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_in_place_ivon_steps_return_the_pure_steps_numbers_in_the_states_own_tensors():
    """ivon.update_with / update_and_sample_with with inplace=True (the federated solver's loop)."""
    g = torch.Generator().manual_seed(3)
    d, key = 1003, torch.tensor(5)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    state = ivon.IVONState(r(d), r(d).abs(), r(d), 4)
    grads, eps = r(1, d), r(1, d)
    terms = ivon.update_terms(state.mean, lr=0.02, ess=30.0, delta=r(d).abs() + 0.1, beta1=0.9, beta2=0.999,
                              prior_mean=r(d), v=r(d), u=0.1 * r(d).abs())
    calls = ((lambda s, **kw: ivon.update_and_sample_with(s, grads, eps, key, 1, terms, **kw)),
             (lambda s, **kw: (ivon.update_with(s, grads, eps, terms, **kw),)))
    for call in calls:
        expected = call(state)
        own = ivon.IVONState(*(t.clone() for t in state[:3]), state.step)
        result = call(own, inplace=True)
        assert result[0].step == expected[0].step == 5
        assert all(a is b for a, b in zip(result[0][:3], own[:3], strict=False))
        for a, b in zip((*result[0][:3], *result[1:]), (*expected[0][:3], *expected[1:]), strict=False):
            assert torch.equal(a, b)


def test_an_in_place_step_refuses_a_state_that_shares_memory_with_its_inputs():
    d = 16
    mean = torch.randn(d)
    terms = ivon.update_terms(mean, lr=0.1, ess=10.0, delta=0.1, beta1=0.9, beta2=0.999, prior_mean=mean)
    grads, eps = torch.randn(1, d), torch.randn(1, d)
    aliased_prior = ivon.IVONState(mean, torch.ones(d), torch.zeros(d), 0)   # m is also the prior mean
    shared = torch.ones(d)
    aliased_state = ivon.IVONState(mean.clone(), shared, shared, 0)          # h and g one tensor
    for state in (aliased_prior, aliased_state):
        before = [t.clone() for t in state[:3]]
        with pytest.raises(ValueError, match="share memory"):
            ivon.update_with(state, grads, eps, terms, inplace=True)
        with pytest.raises(ValueError, match="share memory"):
            ivon.update_and_sample_with(state, grads, eps, torch.tensor(1), 1, terms, inplace=True)
        # refused before writing anything
        assert all(torch.equal(a, b) for a, b in zip(state[:3], before, strict=False))
    fine = ivon.init(mean, 0.5)   # init copies the mean
    assert ivon.update_with(fine, grads, eps, terms, inplace=True).step == 1


@pytest.mark.compiled
def test_compiled_rows_sampling_is_each_clients_own_block_of_the_stream():
    """sample_rows_step (the cohort's sampling, keys as a column rather than vmap) against the stream, for cohorts of
    several and of one client."""
    d, S = 301, 2
    g = torch.Generator().manual_seed(4)
    for rows in (3, 2, 1):
        mean, hess, delta = (torch.randn(rows, d, generator=g), torch.rand(rows, d, generator=g),
                             torch.rand(rows, d, generator=g))
        ess = torch.tensor(30.0)
        keys = torch.stack([rng.block_key(torch.tensor(2024 + i), 5) for i in range(rows)])
        thetas, eps = kernels.sample_rows_step(mean, hess, delta, ess, keys, S)
        assert thetas.shape == eps.shape == (rows, S, d)
        for i in range(rows):
            torch.testing.assert_close(eps[i].reshape(-1), rng.counter_normal(keys[i], S * d, torch.float64, "cpu"),
                                       rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(thetas[i], mean[i] + eps[i] / torch.sqrt(30.0 * (hess[i] + delta[i])))
