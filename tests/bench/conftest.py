import pytest


@pytest.fixture(autouse=True)
def _no_aoti_probe_by_default(monkeypatch):
    """The suite's AOTInductor probe (bench/suite/startup.aoti_probe) compiles a package in a fresh process:
    off in these tests unless a test turns it on (test_suite.py's probe tests do)."""
    monkeypatch.setenv("OSTINATO_SUITE_AOTI_PROBE", "0")
