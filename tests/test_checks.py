"""The one-reduction checks give the answers of the elementwise ones they replace."""

import math

import pytest
import torch

from bayesadmm.checks import all_finite, all_positive

CASES = [[1.0, 2.0], [0.0, 1.0], [-0.0, 1.0], [-1.0, 2.0], [math.nan, 1.0], [1.0, math.inf], [-math.inf, 1.0],
         [math.inf, math.nan], [1e-45, 3e38], [], [5.0]]


@pytest.mark.parametrize("values", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_same_answers_as_the_elementwise_checks(values, dtype):
    x = torch.tensor(values, dtype=dtype)
    assert all_positive(x) == bool((x > 0).all())
    assert all_finite(x) == bool(torch.isfinite(x).all())
    long = torch.cat([torch.rand(10_000, dtype=dtype) + 1, x, torch.rand(777, dtype=dtype) + 1])   # vectorised paths
    assert all_positive(long) == bool((long > 0).all())
    assert all_finite(long) == bool(torch.isfinite(long).all())


def test_integer_complex_and_zero_dimensional_tensors():
    assert all_finite(torch.tensor([1, -2])) and all_positive(torch.tensor([1, 2]))
    assert not all_positive(torch.tensor([0]))
    assert all_finite(torch.tensor([1 + 2j])) and not all_finite(torch.tensor([complex(1, math.inf)]))
    assert all_finite(torch.tensor(3.0)) and not all_finite(torch.tensor(math.nan)) and all_positive(torch.tensor(2.0))
