"""`ostinato bench --help` names every runner the suite has."""
import subprocess
import sys


def test_bench_help_names_every_runner():
    from bench.suite import configs
    text = subprocess.run([sys.executable, "-m", "ostinato", "bench", "--help"], capture_output=True, text=True,
                          timeout=120).stdout
    flat = " ".join(text.split())
    missing = [r for r in configs.RUNNERS if r not in flat]
    assert not missing, missing
