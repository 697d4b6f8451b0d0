"""The parameter-tuple arithmetic that writes into fresh tensors (add_scaled, lincomb, total) gives the numbers of the
plain pairwise expressions bit for bit, and never modifies its arguments."""

import pytest
import torch

from bayesadmm.families import natural as nat


def _tuple(seed: int, dtype: torch.dtype, shapes=((7,), (3, 3))):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=gen, dtype=dtype) * 10.0 ** torch.randint(-3, 4, (), generator=gen)
                 for shape in shapes)


def _copies(a):
    return tuple(x.clone() for x in a)


def _bitwise_equal(a, b) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [0.37, -2.0, 1e-3])
def test_add_scaled_is_add_of_scale_bit_for_bit(dtype, c):
    a, b = _tuple(0, dtype), _tuple(1, dtype)
    a0, b0 = _copies(a), _copies(b)
    for coefficient in (c, torch.tensor(c, dtype=torch.float64)):
        assert _bitwise_equal(nat.add_scaled(a, coefficient, b), nat.add(a, nat.scale(b, coefficient)))
    assert _bitwise_equal(a, a0) and _bitwise_equal(b, b0)   # arguments untouched


def test_add_scaled_keeps_the_wider_dtype_of_its_terms():
    a, b = _tuple(0, torch.float64), _tuple(1, torch.float32)
    result = nat.add_scaled(a, 0.5, b)
    assert all(x.dtype == torch.float64 for x in result)
    assert _bitwise_equal(result, nat.add(a, nat.scale(b, 0.5)))


def test_add_scaled_refuses_mismatched_shapes_and_vector_factors():
    a = _tuple(0, torch.float64)
    with pytest.raises(ValueError, match="mismatched shapes"):
        nat.add_scaled(a, 1.0, _tuple(1, torch.float64, shapes=((7,), (3, 2))))
    with pytest.raises(ValueError, match="scalar"):
        nat.add_scaled(a, torch.ones(2), a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_total_is_the_left_fold_of_add_bit_for_bit(dtype):
    items = [_tuple(seed, dtype) for seed in range(6)]
    before = [_copies(a) for a in items]
    expected = items[0]
    for a in items[1:]:
        expected = nat.add(expected, a)
    assert _bitwise_equal(nat.total(items), expected)
    assert _bitwise_equal(nat.total(iter(items)), expected)   # any iterable
    assert all(_bitwise_equal(a, b) for a, b in zip(items, before, strict=False))
    single = nat.total(items[:1])
    # a copy
    assert _bitwise_equal(single, items[0]) and all(x is not y for x, y in zip(single, items[0], strict=False))
    mixed = [_tuple(0, torch.float32), _tuple(1, torch.float64), _tuple(2, torch.float32)]
    assert _bitwise_equal(nat.total(mixed), nat.add(nat.add(mixed[0], mixed[1]), mixed[2]))   # widens like add
    with pytest.raises(ValueError, match="empty"):
        nat.total([])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lincomb_is_the_left_fold_of_scaled_terms_bit_for_bit(dtype):
    pairs = [(0.3, _tuple(0, dtype)), (-1.7, _tuple(1, dtype)), (2.5, _tuple(2, dtype))]
    expected = nat.scale(pairs[0][1], pairs[0][0])
    for c, a in pairs[1:]:
        expected = nat.add(expected, nat.scale(a, c))
    assert _bitwise_equal(nat.lincomb(*pairs), expected)
