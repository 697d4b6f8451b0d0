"""The nn.Module optimizer's own fused kernels (optim/optimizer.py) compiled: tests/conftest.py runs IVON's kernels
eagerly in tests not marked `compiled`, which is how tests/optim/test_ivon.py runs them."""

import pytest
from tests.optim import test_ivon


@pytest.mark.compiled
def test_compiled_counter_noise_samples_are_block_after_block_of_the_stream():
    """The compiled sampling and update-and-perturb kernels of noise="counter" draw the stream's blocks in order
    (`test_ivon.test_counter_noise_samples_are_block_after_block_of_the_stream`, there with the eager kernels)."""
    test_ivon.test_counter_noise_samples_are_block_after_block_of_the_stream()
