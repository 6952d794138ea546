"""The README's Python example runs as written and gives the model's outputs."""
import os
import re

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
