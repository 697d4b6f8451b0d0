"""`base.stacked`: torch.stack into a reused buffer, for servers that reduce many replies."""

import torch

from bayesadmm.algorithms.base import stacked
from bayesadmm.algorithms.fedavg import average


def test_stacked_is_torch_stack_and_reuses_its_buffer():
    vectors = [torch.randn(5000) for _ in range(7)]
    first = stacked(vectors)
    assert torch.equal(first, torch.stack(vectors))
    again = stacked([v + 1 for v in vectors])
    assert again.data_ptr() == first.data_ptr() and torch.equal(again, torch.stack(vectors) + 1)
    other = stacked(vectors[:3])                                   # another shape: another buffer
    assert torch.equal(other, torch.stack(vectors[:3]))
    leaf = torch.randn(4, requires_grad=True)                      # autograd: a plain torch.stack
    assert stacked([leaf, leaf]).requires_grad


def test_fedavg_mean_is_the_bits_of_the_plain_stack_mean_for_many_clients():
    """The server reduces the reused buffer exactly as it reduced a fresh stack (1000 replies, both weightings)."""
    replies = {k: {"theta": torch.randn(3001, dtype=torch.float32), "num-examples": torch.tensor(float(k % 7 + 1))}
               for k in range(1000)}
    thetas = torch.stack([replies[k]["theta"] for k in range(1000)])
    counts = torch.stack([replies[k]["num-examples"] for k in range(1000)]).to(torch.float32)
    for _ in range(2):
        assert torch.equal(average(replies, weighted=False), thetas.mean(dim=0))
        assert torch.equal(average(replies, weighted=True), (counts[:, None] * thetas).sum(dim=0) / counts.sum())
