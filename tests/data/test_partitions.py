"""Tests for bayesadmm.data.partitions (client splits, Gamma/Dirichlet sampling, summaries)."""

from __future__ import annotations

import math

import pytest
import torch

from bayesadmm.data import partitions as P
from bayesadmm.data.partitions import (
    PARTITIONS,
    classes_per_client,
    describe,
    heterogeneity,
    iid,
    label_counts,
    make_partition,
    per_class_dirichlet,
    plot_label_distribution,
    sample_dirichlet,
    sample_gamma,
    subsample,
    two_level_dirichlet,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fashion_like_labels(n: int = 6000, num_classes: int = 10, seed: int = 123) -> torch.Tensor:
    """Balanced labels in random order, like a FashionMNIST subset."""
    labels = torch.arange(n) % num_classes
    return labels[torch.randperm(n, generator=gen(seed))]


def assert_partition(parts: list[torch.Tensor], n: int) -> None:
    """Sorted int64 parts, none empty, every index in [0, n) exactly once."""
    for part in parts:
        assert part.dtype == torch.int64 and part.ndim == 1
        assert part.numel() > 0
        assert torch.equal(part, torch.sort(part)[0])
    everything = torch.cat(parts)
    assert everything.numel() == n
    assert torch.equal(torch.sort(everything)[0], torch.arange(n))


SPLITS = [
    ("iid", {}),
    ("two-level-dirichlet", {}),
    ("two-level-dirichlet", {"alpha1": 0.3, "alpha2": 0.1}),
    ("per-class-dirichlet", {}),
    ("per-class-dirichlet", {"alpha": 0.05}),
]


# ---------------------------------------------------------------------------
# determinism and partition property
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, kw", SPLITS + [("classes-per-client", {"per_class": 50})])
def test_same_seed_same_split_other_seed_other_split(name, kw):
    labels = fashion_like_labels()
    a = make_partition(name, labels, 10, gen(0), **kw)
    b = make_partition(name, labels, 10, gen(0), **kw)
    c = make_partition(name, labels, 10, gen(1), **kw)
    assert len(a) == len(b) == 10
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("name, kw", SPLITS)
def test_global_rng_is_neither_used_nor_changed(name, kw):
    labels = fashion_like_labels()
    torch.manual_seed(5)
    a = make_partition(name, labels, 7, gen(3), **kw)
    state = torch.get_rng_state()
    torch.manual_seed(99)  # a different global state must not matter
    b = make_partition(name, labels, 7, gen(3), **kw)
    torch.manual_seed(5)
    make_partition(name, labels, 7, gen(3), **kw)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name, kw", SPLITS)
@pytest.mark.parametrize("num_clients", [1, 10, 100])
def test_partition_is_disjoint_complete_and_nonempty(name, kw, num_clients):
    labels = fashion_like_labels()
    for seed in range(3):
        assert_partition(make_partition(name, labels, num_clients, gen(seed), **kw), labels.numel())


def test_iid_sizes_differ_by_at_most_one_and_mix_classes():
    labels = fashion_like_labels(n=1003)
    parts = iid(labels, 10, gen(0))
    sizes = [p.numel() for p in parts]
    assert sizes == [101, 101, 101] + [100] * 7
    counts = label_counts(labels, parts, 10)
    assert (counts > 0).all()  # ~10 of each class per client


def test_dirichlet_splits_keep_every_client_nonempty_under_extreme_settings():
    # Few examples, many clients, tiny concentrations: almost every draw
    # leaves clients empty before the repair; even one example per client works.
    for n, k in ((60, 50), (50, 50), (1000, 100)):
        labels = fashion_like_labels(n=n)
        for seed in range(5):
            assert_partition(two_level_dirichlet(labels, k, gen(seed), alpha1=0.05, alpha2=0.05), n)
            assert_partition(per_class_dirichlet(labels, k, gen(seed), alpha=0.05), n)


def test_empty_client_repair_moves_one_example_of_the_preferred_class():
    # client 2 has (almost) no weight anywhere but prefers class 1
    log_w = torch.log(torch.tensor([[0.7, 0.2], [0.3, 0.8], [1e-9, 1e-8]], dtype=torch.float64))
    counts = P._counts_from_log_weights([6, 4], log_w)  # 6 examples of class 0, 4 of class 1
    # before the repair: [[4, 1], [2, 3], [0, 0]]; donor is client 0, which holds class 1
    assert counts.tolist() == [[4, 0], [2, 3], [0, 1]]


def test_apportion_sums_exactly_and_follows_largest_remainders():
    weights = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    assert P._apportion(10, weights).tolist() == [5, 3, 2]
    assert P._apportion(7, weights).tolist() == [4, 2, 1]  # quotas 3.5, 2.1, 1.4
    for total in (0, 1, 13, 999):
        w = torch.log(sample_dirichlet(torch.full((17,), 0.3), gen(total)))
        counts = P._apportion(total, w)
        assert int(counts.sum()) == total and (counts >= 0).all()


# ---------------------------------------------------------------------------
# heterogeneity of the two-level split (FedLap App. E.1)
# ---------------------------------------------------------------------------


def test_two_level_dirichlet_is_as_heterogeneous_as_the_paper_says():
    # The paper: "2 clients have 50 % of the data, 6 clients 90 %; 60-95 % of
    # a client's data within 4 classes".  Check loose versions on average
    # over seeds (uniform would give 2/10 and 4/10).
    labels = fashion_like_labels()
    stats = [heterogeneity(labels, two_level_dirichlet(labels, 10, gen(s)), 10) for s in range(20)]
    largest2 = sum(s["largest2_share"] for s in stats) / len(stats)
    top4 = [share for s in stats for share in s["top_class_share"]]
    assert 0.3 < largest2 < 0.7, largest2
    assert sum(s["clients_for_90"] for s in stats) / len(stats) <= 8
    assert sum(top4) / len(top4) > 0.65
    assert min(top4) > 0.45
    # per-class Dirichlet with the same alpha keeps sizes much more even
    even = [heterogeneity(labels, per_class_dirichlet(labels, 10, gen(s)), 10)["largest2_share"] for s in range(20)]
    assert sum(even) / len(even) < largest2


def test_two_level_alpha1_controls_sizes_and_alpha2_controls_class_mix():
    labels = fashion_like_labels()

    def mean_stat(key, **kw):
        values = []
        for s in range(10):
            st = heterogeneity(labels, two_level_dirichlet(labels, 10, gen(s), **kw), 10)
            v = st[key]
            values.append(sum(v) / len(v) if isinstance(v, list) else v)
        return sum(values) / len(values)

    assert mean_stat("largest2_share", alpha1=100.0) < 0.25 < mean_stat("largest2_share", alpha1=0.3)
    assert mean_stat("top_class_share", alpha2=100.0) < 0.5 < mean_stat("top_class_share", alpha2=0.1)


def test_two_level_dirichlet_uses_only_present_classes():
    labels = torch.tensor([3, 7] * 50)
    parts = two_level_dirichlet(labels, 4, gen(0))
    assert_partition(parts, 100)
    counts = label_counts(labels, parts, 10)
    assert counts[:, [0, 1, 2, 4, 5, 6, 8, 9]].sum() == 0


# ---------------------------------------------------------------------------
# classes_per_client
# ---------------------------------------------------------------------------


def test_classes_per_client_gives_exact_classes_and_counts():
    labels = fashion_like_labels(n=6000)  # 600 per class
    for seed in range(3):
        parts = classes_per_client(labels, 100, gen(seed), classes=2, per_class=30)
        counts = label_counts(labels, parts, 10)
        assert ((counts > 0).sum(dim=1) == 2).all()
        assert set(counts.unique().tolist()) == {0, 30}
        everything = torch.cat(parts)
        assert everything.unique().numel() == everything.numel() == 100 * 2 * 30  # disjoint
        assert all(torch.equal(p, torch.sort(p)[0]) for p in parts)
        # classes shared evenly: 200 slots over 10 classes
        assert ((counts > 0).sum(dim=0) == 20).all()
        # and not a fixed pattern: many different class pairs occur
        pairs = {tuple((row > 0).nonzero().flatten().tolist()) for row in counts}
        assert len(pairs) >= 15


def test_classes_per_client_when_capacity_is_exactly_enough_and_uneven():
    # class sizes 10, 10, 40, 40 with per_class 10: capacities 1, 1, 4, 4
    # (clamped to K=4); 4 clients x 2 classes = 8 slots = 1 + 1 + 3 + 3 or
    # similar; must never get stuck.
    labels = torch.tensor([0] * 10 + [1] * 10 + [2] * 40 + [3] * 40)
    for seed in range(30):
        parts = classes_per_client(labels, 4, gen(seed), classes=2, per_class=10)
        counts = label_counts(labels, parts, 4)
        assert ((counts > 0).sum(dim=1) == 2).all() and set(counts.unique().tolist()) <= {0, 10}
        assert torch.cat(parts).unique().numel() == 80


def test_classes_per_client_errors_say_what_fits():
    # MNIST's real class sizes cannot give 100 clients 2 x 300 distinct-class examples.
    mnist_sizes = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(mnist_sizes)])
    with pytest.raises(ValueError, match=r"only 194 such blocks; per_class <= 293 would fit"):
        classes_per_client(labels, 100, gen(0))
    assert len(classes_per_client(labels, 100, gen(0), per_class=293)) == 100
    with pytest.raises(ValueError, match="only 10 distinct classes"):
        classes_per_client(fashion_like_labels(), 5, gen(0), classes=11)


# ---------------------------------------------------------------------------
# subsample
# ---------------------------------------------------------------------------


def test_subsample():
    idx = subsample(60000, 0.1, gen(0))
    assert idx.dtype == torch.int64 and idx.numel() == 6000
    assert torch.equal(idx, torch.sort(idx)[0]) and idx.unique().numel() == 6000
    assert int(idx.min()) >= 0 and int(idx.max()) < 60000
    assert torch.equal(idx, subsample(60000, 0.1, gen(0)))
    assert not torch.equal(idx, subsample(60000, 0.1, gen(1)))
    assert torch.equal(subsample(7, 1.0, gen(0)), torch.arange(7))
    assert subsample(7, 0.01, gen(0)).numel() == 1
    assert subsample(10, 0.25, gen(0)).numel() == 3  # 2.5 rounds up
    for bad in (0, 0.0, -0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="fraction"):
            subsample(10, bad, gen(0))
    with pytest.raises(ValueError, match="num_examples"):
        subsample(0, 0.5, gen(0))


# ---------------------------------------------------------------------------
# Gamma / Dirichlet sampler
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.5, 1.0, 3.0])
def test_gamma_mean_variance_and_distribution(alpha):
    n = 200_000
    x = sample_gamma(torch.full((n,), alpha), gen(11))
    assert x.dtype == torch.float64 and (x > 0).all()
    # Gamma(a, 1): mean a, variance a, excess kurtosis 6/a, so
    # sd(sample mean) = sqrt(a/n), sd(sample variance) ~ a sqrt((2 + 6/a)/n).
    assert abs(float(x.mean()) - alpha) < 5 * math.sqrt(alpha / n)
    assert abs(float(x.var()) - alpha) < 5 * alpha * math.sqrt((2 + 6 / alpha) / n)
    # Kolmogorov-Smirnov against the exact CDF P(a, x) (regularised lower
    # incomplete gamma) on a subsample; 1.95/sqrt(m) is the 0.1 % critical value.
    m = 20_000
    xs = torch.sort(x[:m])[0]
    cdf = torch.special.gammainc(torch.full_like(xs, alpha), xs)
    grid = torch.arange(1, m + 1, dtype=torch.float64) / m
    ks = float(torch.maximum(grid - cdf, cdf - (grid - 1.0 / m)).max())
    assert ks < 1.95 / math.sqrt(m), ks


def test_gamma_is_reproducible_and_respects_shapes():
    conc = torch.tensor([[0.2, 1.0], [5.0, 40.0]])
    a = sample_gamma(conc, gen(0))
    assert a.shape == (2, 2)
    assert torch.equal(a, sample_gamma(conc, gen(0)))
    assert not torch.equal(a, sample_gamma(conc, gen(1)))
    for bad in ([0.0], [-1.0], [float("inf")], [float("nan")]):
        with pytest.raises(ValueError, match="positive and finite"):
            sample_gamma(torch.tensor(bad), gen(0))


def test_dirichlet_moments_and_tiny_concentrations():
    alpha = torch.tensor([0.5, 1.0, 3.0])
    n = 100_000
    p = sample_dirichlet(alpha.expand(n, 3), gen(2))
    assert torch.allclose(p.sum(dim=1), torch.ones(n, dtype=torch.float64))
    a0 = float(alpha.sum())
    mean = alpha / a0
    var = mean * (1 - mean) / (a0 + 1)
    assert torch.allclose(p.mean(dim=0), mean.double(), atol=5 * float(var.max().sqrt()) / math.sqrt(n))
    assert torch.allclose(p.var(dim=0), var.double(), rtol=0.03)
    # Gammas of a = 0.001 underflow to 0; the log-space Dirichlet stays a
    # probability vector (nearly one-hot).
    q = sample_dirichlet(torch.full((1000, 5), 1e-3), gen(3))
    assert torch.isfinite(q).all() and torch.allclose(q.sum(dim=1), torch.ones(1000, dtype=torch.float64))
    assert float(q.max(dim=1)[0].mean()) > 0.99


# ---------------------------------------------------------------------------
# summaries and plots
# ---------------------------------------------------------------------------


def test_label_counts_and_describe():
    labels = torch.tensor([0, 0, 1, 2, 2, 2, 3, 3])
    parts = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5, 6]), torch.tensor([7])]
    counts = label_counts(labels, parts, 5)
    assert counts.tolist() == [[2, 1, 0, 0, 0], [0, 0, 3, 1, 0], [0, 0, 0, 1, 0]]
    s = heterogeneity(labels, parts, 5)
    assert s["sizes"] == [3, 4, 1]
    assert s["largest2_share"] == pytest.approx(7 / 8)
    assert s["clients_for_50"] == 1 and s["clients_for_90"] == 3  # 4/8 is 50 % already; 7/8 < 90 %
    assert s["disjoint"] and s["assigned"] == 8
    text = describe(labels, parts, 5)
    assert "3 clients, 8 examples (all examples assigned, disjoint)" in text
    assert "largest 2 clients hold 87.5% of the data" in text
    assert "top 4 classes: min 100.0%" in text
    overlapping = describe(labels, [torch.tensor([0, 1]), torch.tensor([1])], 5)
    assert "2 of 8 examples assigned, OVERLAPPING" in overlapping
    with pytest.raises(ValueError, match="labels outside"):
        label_counts(labels, parts, 3)
    with pytest.raises(ValueError, match="indices outside"):
        label_counts(labels, [torch.tensor([8])], 5)


def test_describe_matches_the_papers_statistics_format():
    labels = fashion_like_labels()
    text = describe(labels, two_level_dirichlet(labels, 10, gen(0)), 10)
    assert text.count("\n") == 4
    assert "clients hold 50 %" in text and "top 4 classes" in text


@pytest.mark.parametrize("num_clients, num_classes", [(10, 10), (100, 10), (10, 100)])
def test_plot_is_written(tmp_path, num_clients, num_classes):
    labels = fashion_like_labels(n=100 * num_classes, num_classes=num_classes)
    parts = two_level_dirichlet(labels, num_clients, gen(0))
    path = tmp_path / f"labels-{num_clients}-{num_classes}.png"
    plot_label_distribution(labels, parts, num_classes, path, title="test split")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000


# ---------------------------------------------------------------------------
# registry and argument errors
# ---------------------------------------------------------------------------


def test_registry_and_make_partition_errors():
    assert set(PARTITIONS) == {"iid", "two-level-dirichlet", "per-class-dirichlet", "classes-per-client", "shards",
                               "sized-dirichlet"}
    labels = fashion_like_labels(n=100)
    with pytest.raises(ValueError, match="valid names: iid, two-level-dirichlet, per-class-dirichlet"):
        make_partition("dirichlet", labels, 5, gen(0))
    with pytest.raises(ValueError, match=r"unknown setting\(s\) alpha; it takes: alpha1, alpha2"):
        make_partition("two-level-dirichlet", labels, 5, gen(0), alpha=0.1)
    with pytest.raises(ValueError, match="it takes: none"):
        make_partition("iid", labels, 5, gen(0), alpha=0.1)


@pytest.mark.parametrize("split", [iid, two_level_dirichlet, per_class_dirichlet, classes_per_client])
def test_argument_errors(split):
    labels = fashion_like_labels(n=100)
    with pytest.raises(TypeError, match="torch.Generator"):
        split(labels, 5, None)
    with pytest.raises(TypeError, match="torch.Generator"):
        split(labels, 5, 0)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_clients"):
            split(labels, bad, gen(0))
    with pytest.raises(ValueError, match="1-D"):
        split(labels.reshape(10, 10), 5, gen(0))
    with pytest.raises(ValueError, match="integer dtype"):
        split(labels.double(), 5, gen(0))


def test_more_clients_than_examples_and_bad_concentrations():
    labels = fashion_like_labels(n=5)
    for split in (iid, two_level_dirichlet, per_class_dirichlet):
        with pytest.raises(ValueError, match="cannot give 6 clients"):
            split(labels, 6, gen(0))
    with pytest.raises(ValueError, match="alpha1"):
        two_level_dirichlet(labels, 2, gen(0), alpha1=0)
    with pytest.raises(ValueError, match="alpha2"):
        two_level_dirichlet(labels, 2, gen(0), alpha2=float("inf"))
    with pytest.raises(ValueError, match="alpha"):
        per_class_dirichlet(labels, 2, gen(0), alpha=-0.5)


def test_shards_fit_mnist_sized_data_and_give_label_sorted_blocks():
    from bayesadmm.data.partitions import shards

    g = torch.Generator().manual_seed(0)
    # MNIST's class sizes: 200 x 300 = 60,000 fits although classes_per_client (distinct classes) does not
    sizes = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])
    parts = shards(labels, 100, g, classes=2, per_class=300)
    assert len(parts) == 100 and all(p.numel() == 600 for p in parts)
    everything = torch.cat(parts)
    assert everything.unique().numel() == 60000                   # disjoint and complete
    classes = [labels[p].unique().numel() for p in parts]
    assert max(classes) <= 4 and sum(c <= 2 for c in classes) >= 80  # mostly two classes per client
    again = shards(labels, 100, torch.Generator().manual_seed(0), classes=2, per_class=300)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ValueError, match="need"):
        shards(labels, 101, g, classes=2, per_class=300)
