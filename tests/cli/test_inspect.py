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


def test_inspect_passes_from_a_file_shows_recorded_counts(tmp_path, capsys):
    _, prog = tiny_decoder_program(seed=3)
    path = tmp_path / "dec.ost"
    prog.save(path)
    assert main(["inspect", "--passes", str(path), "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    rows = t["passes"]
    assert rows[0]["pass"] == "export" and rows[-1]["nodes"] == prog.num_nodes
    assert [r["pass"] for r in rows[1:]] == [name for name, _ in ostinato.passes.DEFAULT_PIPELINE]
    assert rows[0]["nodes"] > rows[-1]["nodes"]          # the fused patterns removed nodes
    assert all("ms" not in r for r in rows)              # times are not saved: same model, same bytes
    assert main(["inspect", "--passes", str(path)]) == 0
    text = capsys.readouterr().out
    assert "times are not saved" in text and f"{prog.num_nodes}" in text


FACTORY = '''
import torch
def small():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    return m, (torch.randn(2, 8),)
def not_a_model():
    return 3
'''


def test_inspect_passes_exports_a_factory_with_times(tmp_path, capsys, monkeypatch):
    (tmp_path / "facmod.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["inspect", "--passes", "facmod:small", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["model"] == "Sequential" and all(r["ms"] >= 0 for r in t["passes"])
    assert t["passes"][0]["nodes"] == 2 and t["passes"][-1]["nodes"] == 1  # linear + relu → ost.linear
    assert main(["inspect", "--passes", "facmod:not_a_model"]) == 2
    assert "not (model, args[, kwargs])" in capsys.readouterr().err
    assert main(["inspect", "--passes", "facmod:missing"]) == 2
    assert "has no function missing" in capsys.readouterr().err
