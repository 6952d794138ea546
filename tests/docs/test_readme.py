"""The README's quick start works as written: the Python example gives the model's outputs, the two
set-up commands are the scripts CI runs, and the command-line lines run."""
import os
import re
import shutil
import subprocess

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_python_example_runs():
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    model, exe = ns["model"], ns["exe"]
    x = torch.randn(2, 16)
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(exe(x), ref, rtol=1e-5, atol=1e-5)


def test_readme_names_exactly_the_two_setup_commands():
    text = open(os.path.join(ROOT, "README.md")).read()
    commands = re.findall(r"```\n(bash scripts/\S+)\n```", text)
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "scripts/test.sh" in ci


def _quick_start_cli_block(text: str) -> str:
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "ostinato export" in b]
    assert len(blocks) == 1, "README's quick start has one ```sh block with the ostinato commands"
    return blocks[0]


def test_readme_cli_lines_run_as_written(tmp_path):
    """The quick start's shell lines, run by bash from a copy of the repository's root (its examples/
    and .venv), so the factory import and the activation work as they do for a new user."""
    block = _quick_start_cli_block(open(os.path.join(ROOT, "README.md")).read())
    assert "source .venv/bin/activate" in block
    os.symlink(os.path.join(ROOT, ".venv"), tmp_path / ".venv")
    shutil.copytree(os.path.join(ROOT, "examples"), tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"                       # no ostinato on PATH until the block activates it
    r = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    out_file = re.search(r"-o (\S+\.ost)", block).group(1)
    assert (tmp_path / out_file).stat().st_size > 0
    assert f"wrote {out_file}: TinyDecoder" in r.stdout
    assert "replay" in r.stdout and "[1, 1, 256]" in r.stdout and "median step" in r.stdout


def test_readme_cli_options_parse():
    """The flags the quick start's prose shows are valid: the SPEC parses, the --dynamic form matches."""
    from ostinato.cli.export import _DYNAMIC_RE
    from ostinato.cli.factory import parse_input_spec
    text = open(os.path.join(ROOT, "README.md")).read()
    specs = re.findall(r'--example-inputs "([^"]+)"', text)
    dynamics = re.findall(r"--dynamic (\S+?)`", text)
    assert specs and dynamics
    for spec in specs:
        assert parse_input_spec(spec)
    for d in dynamics:
        assert _DYNAMIC_RE.match(d), d
