import os

import pytest
import torch

# Runs in tests use one process unless a test asks for workers (starting worker processes costs seconds).
os.environ.setdefault("BAYESADMM_WORKERS", "1")
# No outside traffic from the Flower tests (tests/flower): Flower's telemetry and update check, read at import time.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


# IVON's fused kernels (bayesadmm.optim.kernels) run eagerly in tests, and in the processes tests start (they inherit
# the environment): compiling each kernel variant costs seconds on an empty Inductor cache, more than most tests run.
# Tests marked `compiled` (the compiled kernels against the eager maths, tests/optim/test_kernels.py) and `slow` (the
# end-to-end runs, as users run them) compile them. BAYESADMM_COMPILE set outside pytest applies to every test.
_COMPILE_SETTING = os.environ.get("BAYESADMM_COMPILE")


@pytest.fixture(autouse=True)
def _kernels_eager_unless_compiled(request, monkeypatch):
    from bayesadmm.optim import kernels

    if _COMPILE_SETTING is None:
        compiled = any(request.node.get_closest_marker(name) for name in ("compiled", "slow"))
        monkeypatch.setenv("BAYESADMM_COMPILE", "1" if compiled else "0")
    kernels.recheck_compile_enabled()
    yield
    kernels.recheck_compile_enabled()


@pytest.fixture(autouse=True)
def _methods_environment_restored():
    """A command run in this process with --methods names its files in BAYESADMM_METHODS for the processes it starts
    (`cli.methods.load`); a test's command must not hand them to the next test's commands."""
    saved = os.environ.get("BAYESADMM_METHODS")
    yield
    if saved is None:
        os.environ.pop("BAYESADMM_METHODS", None)
    else:
        os.environ["BAYESADMM_METHODS"] = saved


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
