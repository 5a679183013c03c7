"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """These tensors are small: intra-op threads only add contention on a shared CI box.
    A module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def oracles():
    """`diagnose`'s oracles, shared by the diagnoses of one module (they do not depend on the
    variant)."""
    from harness.diagnose import OracleCache

    return OracleCache()
