"""`base.StackBuffer`: torch.stack into a reused buffer, for servers that reduce many replies."""

import torch

from bayesadmm.algorithms.base import StackBuffer
from bayesadmm.algorithms.fedavg import UnweightedMean, WeightedMean


def test_stack_buffer_is_torch_stack_and_reuses_its_buffer():
    stack = StackBuffer()
    vectors = [torch.randn(5000) for _ in range(7)]
    first = stack(vectors)
    assert torch.equal(first, torch.stack(vectors))
    again = stack([v + 1 for v in vectors])
    assert again.data_ptr() == first.data_ptr() and torch.equal(again, torch.stack(vectors) + 1)
    other = stack(vectors[:3])                                     # another shape: another buffer
    assert torch.equal(other, torch.stack(vectors[:3]))
    leaf = torch.randn(4, requires_grad=True)                      # autograd: a plain torch.stack
    assert stack([leaf, leaf]).requires_grad


def test_each_stack_buffer_has_its_own_memory():
    """Two algorithms in one process do not write into each other's stacks."""
    vectors = [torch.randn(100) for _ in range(3)]
    one, two = StackBuffer(), StackBuffer()
    first = one(vectors)
    assert two(vectors).data_ptr() != first.data_ptr()
    assert torch.equal(first, torch.stack(vectors))


def test_fedavg_mean_is_the_bits_of_the_plain_stack_mean_for_many_clients():
    """The server reduces the reused buffer exactly as it reduced a fresh stack (1000 replies, both weightings)."""
    replies = {k: {"theta": torch.randn(3001, dtype=torch.float32), "num-examples": torch.tensor(float(k % 7 + 1))}
               for k in range(1000)}
    thetas = torch.stack([replies[k]["theta"] for k in range(1000)])
    counts = torch.stack([replies[k]["num-examples"] for k in range(1000)]).to(torch.float32)
    unweighted, weighted = UnweightedMean(), WeightedMean()
    for _ in range(2):
        assert torch.equal(unweighted(replies), thetas.mean(dim=0))
        assert torch.equal(weighted(replies), (counts[:, None] * thetas).sum(dim=0) / counts.sum())
