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


def _fallback_program(tmp_path):
    from frontend.fallback_ops import model_and_input
    model, x = model_and_input(seed=11)
    prog = ostinato.export(model, (x,))
    path = tmp_path / "fb.ost"
    prog.save(path)
    return prog, path


def test_inspect_lists_the_fallback_ops_with_node_source_and_reason(tmp_path, capsys):
    from frontend.fallback_ops import FALLBACK_OPS
    prog, path = _fallback_program(tmp_path)
    assert main(["inspect", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = d["fallback"]
    assert {r["op"] for r in rows} == FALLBACK_OPS and len(rows) == 3
    by_node = {n.name: n for n in prog.graph.nodes}
    for r in rows:
        assert by_node[r["node"]].op == r["op"]
        assert r["source"].startswith("fallback_ops.py:") and "torch.ops.ostinato_fb." in r["source"]
        assert r["reason"].startswith(f"no ostinato kernel for {r['op'][len('fallback.'):]}")
        assert "custom op of the 'ostinato_fb' namespace" in r["reason"]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "fallback  3 node(s) run through eager torch" in text
    for r in rows:
        assert f"{r['op']}  node {r['node']}  at {r['source']}" in text and r["reason"] in text


def test_inspect_shows_no_fallback_section_without_fallback_ops(tmp_path, capsys):
    prog = ostinato.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), (torch.randn(2, 4),))
    prog.save(tmp_path / "plain.ost")
    assert main(["inspect", str(tmp_path / "plain.ost"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fallback"] == []
    assert main(["inspect", str(tmp_path / "plain.ost")]) == 0
    assert "run through eager torch" not in capsys.readouterr().out


def test_inspect_in_a_fresh_process_needs_import_for_custom_ops(tmp_path):
    import os
    _, path = _fallback_program(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    frontend_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "frontend")
    cmd = [sys.executable, "-m", "ostinato", "inspect", str(path), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=frontend_dir)
    assert out.returncode == 2 and out.stdout == ""
    assert "ostinato_fb::" in out.stderr and "is registered in this process" in out.stderr
    assert "Fix: pass --import MODULE" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run(cmd + ["--import", "fallback_ops"], capture_output=True, text=True, timeout=120,
                         env=env, cwd=frontend_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(json.loads(out.stdout)["fallback"]) == 3
