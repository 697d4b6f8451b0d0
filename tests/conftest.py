import os

import pytest
import torch

# Runs in tests use one process unless a test asks for workers (starting worker processes costs seconds).
os.environ.setdefault("BAYESADMM_WORKERS", "1")
# No outside traffic from the Flower tests (tests/flower): Flower's telemetry and update check, read at import time.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(autouse=True)
def _float64_and_deterministic():
    """The identities are checked in float64; restore the default afterwards."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _have_fashion_mnist() -> bool:
    from bayesadmm.data import DatasetNotFoundError, load_image_dataset

    try:
        load_image_dataset("fashion-mnist", "train", download=False)
        return True
    except DatasetNotFoundError:
        return False


# Tests on the real FashionMNIST files skip (with the reason) where they are absent; `make test` installs them.
needs_fmnist = pytest.mark.skipif(not _have_fashion_mnist(), reason="FashionMNIST not installed (make setup does it)")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A folder with a small synthetic FashionMNIST (300 training and 40 test images in the real IDX files), for
    command-line tests that need a data_dir but not the real data."""
    from tests.data.test_images import write_dataset

    folder = tmp_path_factory.mktemp("fmnist")
    write_dataset(folder, n_train=300, n_test=40)
    return folder
