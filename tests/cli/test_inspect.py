import json
import subprocess
import sys

import torch

import ostinato
from ostinato.cli.main import main
from ostinato.program.format import SCHEMA_VERSION
from program.models import tiny_decoder_program


def test_inspect_text_and_json(tmp_path, capsys):
    _, prog = tiny_decoder_program(seed=2)
    path = tmp_path / "dec.ost"
    prog.save(path)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"schema v{SCHEMA_VERSION}" in text and "TinyDecoder by ostinato" in text
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
    cpu_default = ostinato.passes.default_pipeline((torch.zeros(1),))     # exported from CPU tensors
    assert [r["pass"] for r in rows[1:]] == [name for name, _ in cpu_default]
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


class _NormLinear(torch.nn.Module):
    """A hand-written RMSNorm (no pattern pass takes it under GENERIC_PIPELINE) and a Linear."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64))
        self.lin = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.lin(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w)


NORM_OPS = ["aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.rsqrt", "aten.mul.Tensor",
            "aten.mul.Tensor"]


def _norm_linear_program(tmp_path):
    from ostinato.passes import GENERIC_PIPELINE
    torch.manual_seed(0)
    prog = ostinato.export(_NormLinear(), (torch.randn(4, 64),), passes=GENERIC_PIPELINE)
    path = tmp_path / "norm_linear.ost"
    prog.save(path)
    return prog, path


def test_inspect_launches_cuda_one_matmul_group(tmp_path, capsys, monkeypatch):
    """Four rows: the norm and the projection after it are one generated kernel (a matmul group)."""
    monkeypatch.delenv("OSTINATO_FUSION", raising=False)
    monkeypatch.delenv("OSTINATO_FUSE_LINEAR", raising=False)
    from ostinato.codegen import schedule
    prog, path = _norm_linear_program(tmp_path)
    assert main(["inspect", "--launches", str(path), "--device", "cuda", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    (row,) = d["launches"]
    assert row["kind"] == "fused" and row["ops"] == NORM_OPS + ["aten.linear"] and row["op_count"] == 7
    (group,) = [item for item in schedule(prog.graph) if hasattr(item, "spec")]
    assert row["kernel"] == f"fused_{group.spec.digest[:16]}" and '"kind":"linear"' in group.spec.to_json()
    # x [4, 64], the norm's w [64], the weight [32, 64] and bias [32] in; [4, 32] out: the normed x never
    # leaves the kernel
    assert row["bytes"] == (4 * 64 + 64 + 32 * 64 + 32 + 4 * 32) * 4
    assert (d["summary"]["launches"], d["summary"]["fused_kernels"], d["summary"]["ops_absorbed"]) == (1, 1, 7)


def test_inspect_launches_cuda_fuses_the_norm_and_leaves_the_linear(tmp_path, capsys, monkeypatch):
    """Matmul groups off (OSTINATO_FUSE_LINEAR=0): the norm is a fused kernel, the projection cuBLAS's."""
    monkeypatch.delenv("OSTINATO_FUSION", raising=False)
    monkeypatch.setenv("OSTINATO_FUSE_LINEAR", "0")
    from ostinato.codegen import schedule
    from ostinato.codegen.triton_source import kernel_name
    prog, path = _norm_linear_program(tmp_path)
    assert main(["inspect", "--launches", str(path), "--device", "cuda", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) == {"device", "launches", "summary"} and d["device"] == "cuda"
    rows = d["launches"]
    assert [r["kind"] for r in rows] == ["fused", "aten.linear"]
    fused, linear = rows
    assert fused["ops"] == NORM_OPS and fused["op_count"] == 6
    group = next(item for item in schedule(prog.graph) if hasattr(item, "spec"))
    assert fused["kernel"] == kernel_name(group.spec) == f"fused_{group.spec.digest[:16]}"
    assert fused["name"] == group.name
    # the kernel reads x [4, 64] and w [64] and writes the normed x [4, 64], all float32
    assert fused["bytes"] == (4 * 64 + 64 + 4 * 64) * 4
    assert linear["ops"] == ["aten.linear"] and linear["kernel"] is None
    # linear: x [4, 64], weight [32, 64], bias [32] in; [4, 32] out
    assert linear["bytes"] == (4 * 64 + 32 * 64 + 32 + 4 * 32) * 4
    assert [r["index"] for r in rows] == [0, 1]
    s = d["summary"]
    assert (s["launches"], s["fused_kernels"], s["ops_absorbed"], s["nodes"], s["skipped"]) == (2, 1, 6, 7, 0)
    assert s["bytes"] == fused["bytes"] + linear["bytes"] and s["fusion"] is True


def test_inspect_launches_cpu_and_fusion_off_run_every_node(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OSTINATO_FUSION", raising=False)
    prog, path = _norm_linear_program(tmp_path)
    assert main(["inspect", "--launches", str(path), "--device", "cpu", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["device"] == "cpu" and all(r["kind"] != "fused" and r["kernel"] is None for r in d["launches"])
    assert [r["kind"] for r in d["launches"]] == NORM_OPS + ["aten.linear"]
    assert [r["name"] for r in d["launches"]] == [n.name for n in prog.graph.nodes]
    assert d["summary"]["launches"] == 7 > 2 and d["summary"]["fused_kernels"] == 0
    assert d["summary"]["fusion"] is False
    # OSTINATO_FUSION=0 is the A/B switch: cuda lowers node by node too
    monkeypatch.setenv("OSTINATO_FUSION", "0")
    assert main(["inspect", "--launches", str(path), "--json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["device"] == "cuda" and off["launches"] == d["launches"]
    assert main(["inspect", "--launches", str(path)]) == 0
    assert "fusion off: OSTINATO_FUSION=0" in capsys.readouterr().out


def test_inspect_launches_human_output_has_table_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OSTINATO_FUSION", raising=False)
    monkeypatch.setenv("OSTINATO_FUSE_LINEAR", "0")
    _, path = _norm_linear_program(tmp_path)
    assert main(["inspect", "--launches", str(path)]) == 0          # cuda is the default device
    text = capsys.readouterr().out
    assert "on cuda (fusion on)" in text
    assert "6: pow, mean, add, rsqrt, mul, mul" in text and "aten.linear" in text
    assert "2.25 KiB" in text                                        # the fused kernel's bytes moved
    assert "2 launches per step (1 generated fused kernels absorbing 6 ops;" in text
    assert main(["inspect", "--launches", str(path), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "7 launches per step (0 generated fused kernels absorbing 0 ops;" in text
    assert "fused_" not in text


def test_inspect_launches_skips_views_and_reports_symbolic_bytes(tmp_path, capsys):
    _, prog = tiny_decoder_program(seed=4)
    path = tmp_path / "dec.ost"
    prog.save(path)
    assert main(["inspect", "--launches", str(path), "--device", "cpu", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    s = d["summary"]
    assert s["nodes"] == prog.num_nodes and 0 < s["skipped"] < s["nodes"]
    assert s["launches"] + s["skipped"] == s["nodes"]
    views = {n.op for n in prog.graph.nodes if ostinato.ir.get_op(n.op).category in ("view", "sym")}
    assert views and not views & {r["kind"] for r in d["launches"]}
    assert s["bytes"] is None and all(r["bytes"] is None for r in d["launches"])    # T is symbolic
    assert main(["inspect", "--launches", str(path), "--device", "cpu"]) == 0
    assert "symbolic" in capsys.readouterr().out


def test_inspect_launches_errors_are_one_line(tmp_path, capsys):
    _, path = _norm_linear_program(tmp_path)
    assert main(["inspect", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--device applies to --launches only" in err and "Fix: add --launches" in err
    assert "Traceback" not in err
    assert main(["inspect", "--launches", str(tmp_path / "missing.ost")]) == 2
    assert "No such file" in capsys.readouterr().err


class _AdaptiveMaxSin(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.adaptive_max_pool2d(x, 3).sin()


def test_inspect_launches_mlx_lists_ops_through_torch(tmp_path, capsys):
    """On MLX an op without a handler (adaptive_max_pool2d) runs through torch: marked with the reason, counted."""
    import pytest
    pytest.importorskip("mlx.core")
    path = tmp_path / "m.ost"
    ostinato.export(_AdaptiveMaxSin(), (torch.randn(1, 2, 7, 7),)).save(path)
    assert main(["inspect", "--launches", str(path), "--device", "mlx", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    marked = {r["kind"]: r["through_torch"] for r in d["launches"]}
    assert marked["aten.adaptive_max_pool2d"] and not marked["aten.sin"] and d["summary"]["through_torch"] == 1
    assert main(["inspect", "--launches", str(path), "--device", "mlx"]) == 0
    assert "1 launch(es) run through torch on mlx" in capsys.readouterr().out


def test_inspect_passes_of_a_factory_says_what_regional_export_did(capsys):
    assert main(["inspect", "--passes", "examples.tiny_decoder:tiny_llama_4_layers"]) == 0
    out = capsys.readouterr().out
    assert "regional export: examples.tiny_decoder.Layer: 4 instances, 4 calls, traced 1x" in out, out
