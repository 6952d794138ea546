import json
import subprocess
import sys

import torch

import ostinato
from ostinato.cli.main import main
from program.models import tiny_decoder_program


def test_inspect_text_and_json(tmp_path, capsys):
    _, prog = tiny_decoder_program(seed=2)
    path = tmp_path / "dec.ost"
    prog.save(path)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "schema v1" in text and "TinyDecoder by ostinato" in text
    assert "s" in text and "(T) in [1, 8]" in text
    assert "layers.0.k_cache: float32[1, 1, 16, 16]" in text
    assert f"{prog.num_nodes} nodes" in text
    assert main(["inspect", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["nodes"] == prog.num_nodes and sum(d["ops"].values()) == prog.num_nodes
    assert d["ops"] == dict(sorted(prog.op_counts().items(), key=lambda kv: (-kv[1], kv[0])))
    assert [i["name"] for i in d["inputs"]] == ["tokens", "pos"]
    assert d["sizes"]["weights_raw"] == sum(t.numel() * t.element_size() for t in prog.weights.values())
    assert d["sizes"]["file"] == path.stat().st_size
    assert d["exporter"]["torch"] == torch.__version__


def test_inspect_errors_are_one_line_with_exit_code(tmp_path, capsys):
    bad = tmp_path / "bad.ost"
    bad.write_bytes(b"hello world" * 20)
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "ostinato inspect: error:" in err and "not an ostinato program" in err
    assert "Traceback" not in err
    assert main(["inspect", str(tmp_path / "missing.ost")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_console_entry_point_runs(tmp_path):
    prog = ostinato.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    prog.save(tmp_path / "lin.ost")
    out = subprocess.run([sys.executable, "-m", "ostinato", "inspect", str(tmp_path / "lin.ost"), "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["ops"] == {"aten.linear": 1}
