"""`ostinato export MODULE:FACTORY`: the program it writes matches eager; each documented error is one
line plus a hint with exit code 2, and --verbose raises instead."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ostinato
from ostinato.cli.factory import INT_HIGH, example_inputs, parse_input_spec
from ostinato.cli.main import main
from ostinato.cli.progress import Stages
from ostinato.errors import ExportError, OstinatoError

FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn


    def mlp():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


    def mlp_with_inputs():
        return mlp(), (torch.randn(2, 16),)


    class AddProject(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x, y, scale=None):
            out = self.proj(x) + y
            return out * scale if scale is not None else out


    def two_inputs():
        torch.manual_seed(2)
        return AddProject(), (torch.randn(3, 8), torch.randn(3, 8))


    def with_kwargs():
        torch.manual_seed(3)
        return AddProject(), (torch.randn(3, 8), torch.randn(3, 8)), {"scale": torch.randn(3, 8)}


    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:          # data-dependent control flow: torch.export cannot trace it
                return x + 1
            return x - 1


    def branchy():
        return Branchy(), (torch.randn(4),)


    def raises():
        raise RuntimeError("weights not found")


    def not_a_model():
        return 3


    @torch.library.custom_op("clitest::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2


    @twice.register_fake
    def _(x):
        return torch.empty_like(x)


    class CustomOp(nn.Module):
        def forward(self, x):
            return twice(x.sin()) + 1


    def custom_op_model():
        return CustomOp(), (torch.randn(3, 5),)
''')


@pytest.fixture(scope="module")
def factory_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("factories")
    (d / "cli_export_factories.py").write_text(FACTORIES)
    (d / "cli_export_broken.py").write_text("raise ValueError('config file missing')\n")
    return d


@pytest.fixture
def in_factory_dir(factory_dir, monkeypatch):
    monkeypatch.chdir(factory_dir)
    return factory_dir


def _fail(capsys, argv, code=2):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err                    # one line and a hint
    assert lines[0].startswith("ostinato export: error: ")
    return lines


def test_module_alone_with_example_inputs_matches_eager(in_factory_dir, tmp_path, capsys):
    out = tmp_path / "mlp.ost"
    assert main(["export", "cli_export_factories:mlp", "--example-inputs", "5x16", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"wrote {out}: Sequential,") and "nodes" in text and "KiB" in text
    prog = ostinato.load(out)
    assert [tuple(v.meta.shape) for v in prog.graph.inputs] == [(5, 16)]
    import cli_export_factories as f
    model = f.mlp().eval()
    exe = ostinato.compile(prog)
    x = torch.randn(5, 16)
    torch.testing.assert_close(exe(x), model(x), rtol=1e-5, atol=1e-5)


def test_factory_inputs_are_used_and_example_inputs_override_them(in_factory_dir, tmp_path, capsys):
    a, b = tmp_path / "a.ost", tmp_path / "b.ost"
    assert main(["export", "cli_export_factories:mlp_with_inputs", "-o", str(a)]) == 0
    assert main(["export", "cli_export_factories:mlp_with_inputs", "--example-inputs", "7x16:float32",
                 "-o", str(b)]) == 0
    capsys.readouterr()
    assert list(ostinato.load(a).graph.inputs[0].meta.shape) == [2, 16]
    assert list(ostinato.load(b).graph.inputs[0].meta.shape) == [7, 16]


def test_default_output_is_named_after_the_factory(in_factory_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(in_factory_dir))
    monkeypatch.chdir(tmp_path)
    assert main(["export", "cli_export_factories:mlp_with_inputs", "-q"]) == 0
    assert (tmp_path / "mlp_with_inputs.ost").exists()
    assert "wrote mlp_with_inputs.ost" in capsys.readouterr().out


def test_dynamic_dims_shared_by_name_run_other_sizes(in_factory_dir, tmp_path, capsys):
    out = tmp_path / "dyn.ost"
    assert main(["export", "cli_export_factories:two_inputs", "--dynamic", "0.0=1:16:batch",
                 "--dynamic", "1.0=1:16:batch", "-o", str(out)]) == 0
    capsys.readouterr()
    prog = ostinato.load(out)
    (sym,) = prog.graph.symbols.values()
    assert (sym.label, sym.min, sym.max) == ("batch", 1, 16)
    import cli_export_factories as f
    model = f.two_inputs()[0].eval()
    exe = ostinato.compile(prog)
    for n in (1, 6, 16):
        x, y = torch.randn(n, 8), torch.randn(n, 8)
        torch.testing.assert_close(exe(x, y), model(x, y), rtol=1e-5, atol=1e-5)
    with pytest.raises(ostinato.errors.InputError, match="outside the range"):
        exe(torch.randn(17, 8), torch.randn(17, 8))


def test_dynamic_on_a_keyword_input(in_factory_dir, tmp_path, capsys):
    out = tmp_path / "kw.ost"
    args = ["export", "cli_export_factories:with_kwargs", "-o", str(out)]
    for spec in ("0.0=2:32:n", "1.0=2:32:n", "scale.0=2:32:n"):
        args += ["--dynamic", spec]
    assert main(args) == 0
    capsys.readouterr()
    import cli_export_factories as f
    model = f.with_kwargs()[0].eval()
    exe = ostinato.compile(ostinato.load(out))
    x, y, s = torch.randn(9, 8), torch.randn(9, 8), torch.randn(9, 8)
    torch.testing.assert_close(exe(x, y, scale=s), model(x, y, scale=s), rtol=1e-5, atol=1e-5)


def test_spec_parsing_and_random_values():
    assert parse_input_spec("2x16:float32, 1:int64,3 ,:bool") == [
        ((2, 16), torch.float32), ((1,), torch.int64), ((3,), torch.float32), ((), torch.bool)]
    a, b, c = example_inputs("64x64,4096:int32,100:bool", seed=4)
    assert a.dtype == torch.float32 and a.std() > 0.5              # random, not zeros
    assert b.dtype == torch.int32 and 0 <= int(b.min()) and int(b.max()) == INT_HIGH - 1
    assert c.dtype == torch.bool and 0 < int(c.sum()) < 100
    torch.testing.assert_close(example_inputs("3x3", seed=7)[0], example_inputs("3x3", seed=7)[0])


@pytest.mark.parametrize("spec, message", [
    ("2xA:float32", "bad sizes '2xA'"),
    ("2x-1", "bad sizes"),
    ("2x16:floaty", "unknown dtype 'floaty'"),
])
def test_bad_spec(in_factory_dir, tmp_path, capsys, spec, message):
    first, hint = _fail(capsys, ["export", "cli_export_factories:mlp", "--example-inputs", spec,
                                 "-o", str(tmp_path / "x.ost")])
    assert message in first and "--example-inputs" in first
    assert hint.strip().startswith("Fix:")
    assert not (tmp_path / "x.ost").exists()


@pytest.mark.parametrize("dynamic, message", [
    ("0-0=1:8", "not ARG.DIM=MIN:MAX[:NAME]"),
    ("0.0=1", "not ARG.DIM=MIN:MAX[:NAME]"),
    ("2.0=1:8", "there are 2 example args"),
    ("0.2=1:8", "input 0 has 2 dims"),
    ("0.0=8:2", "MIN 8 is above MAX 2"),
    ("0.0=4:8", "example size of input 0 dim 0 is 3, outside the range"),
    ("mask.0=1:8", "no keyword argument 'mask'"),
])
def test_bad_dynamic(in_factory_dir, tmp_path, capsys, dynamic, message):
    first, hint = _fail(capsys, ["export", "cli_export_factories:two_inputs", "--dynamic", dynamic,
                                 "-o", str(tmp_path / "x.ost")])
    assert f"--dynamic {dynamic}: " in first and message in first
    assert hint.strip().startswith("Fix:")


def test_same_dynamic_name_with_two_ranges(in_factory_dir, tmp_path, capsys):
    first, _ = _fail(capsys, ["export", "cli_export_factories:two_inputs", "--dynamic", "0.0=1:8:b",
                              "--dynamic", "1.0=1:9:b", "-o", str(tmp_path / "x.ost")])
    assert "b was given another range before (1:8)" in first


@pytest.mark.parametrize("factory, message", [
    ("no_such_module_here:f", "cannot import no_such_module_here"),
    ("cli_export_factories:nothing", "cli_export_factories has no function nothing"),
    ("cli_export_factories:raises", "cli_export_factories:raises() raised RuntimeError: weights not found"),
    ("cli_export_factories:not_a_model", "returned int, not (model, args[, kwargs]) or a model alone"),
    ("cli_export_broken:f", "importing cli_export_broken raised ValueError: config file missing"),
    ("not-a-factory", "is not MODULE:FACTORY"),
])
def test_factory_errors(in_factory_dir, tmp_path, capsys, factory, message):
    first, hint = _fail(capsys, ["export", factory, "--example-inputs", "2x16", "-o", str(tmp_path / "x.ost")])
    assert message in first
    assert hint.strip().startswith("Fix:")


def test_model_alone_needs_example_inputs(in_factory_dir, tmp_path, capsys):
    first, hint = _fail(capsys, ["export", "cli_export_factories:mlp", "-o", str(tmp_path / "x.ost")])
    assert "returned a model without example inputs" in first
    assert "--example-inputs" in hint


def test_untraceable_model_names_torch_export(in_factory_dir, tmp_path, capsys):
    first, hint = _fail(capsys, ["export", "cli_export_factories:branchy", "-o", str(tmp_path / "x.ost")])
    assert "torch.export could not trace Branchy" in first
    assert hint.strip().startswith("Fix:")


def test_verbose_raises_before_or_after_the_subcommand(in_factory_dir, tmp_path):
    argv = ["export", "cli_export_factories:mlp", "-o", str(tmp_path / "x.ost")]
    with pytest.raises(ExportError, match="without example inputs"):
        main(["--verbose"] + argv)
    with pytest.raises(OstinatoError, match="bad sizes"):
        main(argv + ["--example-inputs", "axb", "--verbose"])


def test_trace_strict_reaches_torch_export(in_factory_dir, tmp_path, monkeypatch, capsys):
    seen = []
    real = torch.export.export

    def spy(*a, **kw):
        seen.append(kw["strict"])
        return real(*a, **kw)

    monkeypatch.setattr(torch.export, "export", spy)
    for flags in ([], ["--trace-strict"]):   # --no-cache: an earlier test's export of it would be a hit
        assert main(["export", "cli_export_factories:mlp_with_inputs", *flags, "--no-cache",
                     "-o", str(tmp_path / "s.ost")]) == 0
    capsys.readouterr()
    assert seen == [False, True]


def test_strict_refuses_an_op_ostinato_lacks_which_otherwise_runs_eagerly(in_factory_dir, tmp_path, capsys):
    path = tmp_path / "c.ost"
    first, hint = _fail(capsys, ["export", "cli_export_factories:custom_op_model", "--strict", "-o", str(path)])
    assert "unsupported op(s)" in first and "clitest.twice" in first.replace("::", ".")
    assert "drop --strict" in hint and not path.exists()
    assert main(["export", "cli_export_factories:custom_op_model", "-o", str(path)]) == 0
    capsys.readouterr()
    import cli_export_factories as f
    model, (x,) = f.custom_op_model()
    exe = ostinato.compile(ostinato.load(path))
    x = torch.randn(3, 5)
    torch.testing.assert_close(exe(x), model(x), rtol=1e-5, atol=1e-5)


def test_progress_shows_stages_on_a_terminal_only(in_factory_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["export", "cli_export_factories:mlp_with_inputs", "-o", str(tmp_path / "p.ost")]) == 0
    err = capsys.readouterr().err
    for stage in ("build model", "torch.export", "passes", "save"):
        assert stage in err
    assert main(["export", "cli_export_factories:mlp_with_inputs", "-q", "-o", str(tmp_path / "q.ost")]) == 0
    assert "torch.export" not in capsys.readouterr().err


def test_stages_time_each_stage_when_hidden():
    with Stages(enabled=False) as st:
        st.begin("one")
        st.begin("two", total=2)
        st.advance("a")
        st.advance("b")
    assert set(st.seconds) == {"one", "two"} and all(s >= 0 for s in st.seconds.values())


def test_console_script_exports(in_factory_dir, tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "ostinato")
    out = tmp_path / "cs.ost"
    r = subprocess.run([script, "export", "cli_export_factories:mlp", "--example-inputs", "3x16",
                        "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}") and out.stat().st_size > 0
    r = subprocess.run([script, "export", "cli_export_factories:mlp", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "without example inputs" in r.stderr and "Traceback" not in r.stderr


def test_export_reports_regional_and_the_cache(in_factory_dir, tmp_path, capsys):
    """A stack of repeated blocks: the first export traces the block once and says so; the same model
    with other weights hits the export cache; `cache explain --export` says why another one misses."""
    from ostinato.cache import Cache, set_cache
    from ostinato.cache.disk import DiskTier
    from ostinato.cache.memory import MemoryTier
    (in_factory_dir / "cli_stack_factories.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn


        class Block(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.fc = nn.Linear(d, d)

            def forward(self, x):
                return x + torch.tanh(self.fc(x))


        def stack(d=16):
            return nn.Sequential(*[Block(d) for _ in range(6)]), (torch.randn(2, d),)


        def wider():
            return stack(24)
    '''))
    set_cache(Cache([MemoryTier(64 << 20), DiskTier(tmp_path / "cache")]))
    try:
        assert main(["export", "cli_stack_factories:stack", "-o", str(tmp_path / "a.ost")]) == 0
        out = capsys.readouterr().out
        assert "regional: Block x6 traced 1x" in out and "trace " in out and "passes " in out, out
        assert main(["export", "cli_stack_factories:stack", "-o", str(tmp_path / "b.ost")]) == 0
        assert "export cache hit" in capsys.readouterr().out
        assert main(["export", "cli_stack_factories:stack", "--no-cache", "--no-regional",
                     "-o", str(tmp_path / "c.ost")]) == 0
        out = capsys.readouterr().out
        assert "export cache hit" not in out and "(regional:" not in out
        assert (tmp_path / "a.ost").read_bytes() != (tmp_path / "c.ost").read_bytes()   # other weights
        assert main(["cache", "explain", "--export", "cli_stack_factories:stack"]) == 0
        assert "hit" in capsys.readouterr().out
        assert main(["cache", "explain", "--export", "cli_stack_factories:wider"]) == 0
        out = capsys.readouterr().out
        assert "miss" in out and "target.structure" in out and "target.inputs" in out, out
    finally:
        set_cache(None)


def test_device_moves_model_and_inputs_and_picks_the_passes(in_factory_dir, tmp_path, capsys, monkeypatch):
    """--device cpu exports as before (the CPU default passes); a device this machine lacks is refused with
    a fix; the pipeline the export gets is the one for the device the inputs were moved to."""
    from ostinato.cli import export as cli_export
    seen = []
    real = cli_export._pipeline
    monkeypatch.setattr(cli_export, "_pipeline", lambda name, a, k: seen.append({t.device.type for t in a}) or real(name, a, k))
    out = tmp_path / "m.ost"
    assert main(["export", "cli_export_factories:with_kwargs", "--device", "cpu", "-o", str(out)]) == 0
    capsys.readouterr()
    assert seen == [{"cpu"}]
    assert "small_matvec" not in [r["pass"] for r in ostinato.load(out).info["passes"]]
    first, hint = _fail(capsys, ["export", "cli_export_factories:mlp_with_inputs", "--device", "nonsense",
                                 "-o", str(tmp_path / "x.ost")])
    assert "--device nonsense: not a device torch knows" in first and hint.strip().startswith("Fix:")
    if not torch.cuda.is_available():
        first, hint = _fail(capsys, ["export", "cli_export_factories:mlp_with_inputs", "--device", "cuda",
                                     "-o", str(tmp_path / "x.ost")])
        assert "no CUDA device" in first and "leave --device out" in hint
