"""Each dynamo test starts from a fresh Dynamo and fresh backend counters."""
import pytest
import torch

import ostinato.dynamo as od


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    od.reset_stats()
    yield
    torch._dynamo.reset()
