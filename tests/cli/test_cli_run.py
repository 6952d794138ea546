"""`ostinato run model.ost`: outputs match eager for inputs from a safetensors file, random inputs follow
the program's specs, --json prints one object; each documented error is one line plus a hint."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from ostinato.cli.main import main
from ostinato.errors import InputError, OstinatoError
from program.models import tiny_decoder_program


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """The 2-layer tiny decoder (KV-cache state; T dynamic in [1, 8], exported at T=3), saved."""
    model, prog = tiny_decoder_program(seed=5)
    path = tmp_path_factory.mktemp("run") / "dec.ost"
    prog.save(path)
    return model, str(path)


def _decode_inputs(t: int, gen_seed: int):
    g = torch.Generator().manual_seed(gen_seed)
    return torch.randint(0, 64, (1, t), generator=g), torch.randperm(16, generator=g)[:t]


def _fail(capsys, argv, code=2):
    assert main(argv) == code
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err and captured.out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2, err                    # one line and a hint
    assert lines[0].startswith("ostinato run: error: ")
    return lines[0], lines[1].strip()


def test_text_report_with_random_inputs(decoder, capsys):
    _, path = decoder
    assert main(["run", path, "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert f"{path}: TinyDecoder on cpu, step by step" in out and "random (seed 0)" in out
    assert "float32" in out and "[1, 3, 64]" in out       # T at its export example, vocab 64
    for row in ("load", "compile", "first call", "median step (of 3)", "min step"):
        assert row in out


@pytest.mark.parametrize("replay", [False, True])
def test_json_is_the_only_stdout(decoder, capsys, replay):
    _, path = decoder
    assert main(["run", path, "--json", "--steps", "3"] + (["--replay"] if replay else [])) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["outputs"] == [{"output": "output", "dtype": "float32", "shape": [1, 3, 64]}]
    assert (r["device"], r["replay"], r["steps"], r["model"]) == ("cpu", replay, 3, "TinyDecoder")
    assert r["versions"]["torch"] == torch.__version__ and r["plan_source"] in ("compiled", "cache", "memory")
    ms = r["timings_ms"]
    assert ms["min_step"] <= ms["median_step"] and all(ms[k] > 0 for k in ("load", "first_call"))


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("keys", ["names", "positions"])
def test_inputs_from_safetensors_match_eager(decoder, tmp_path, capsys, replay, keys):
    model, path = decoder
    tokens, pos = _decode_inputs(5, gen_seed=11)                   # T = 5: not the export example
    names = ("tokens", "pos") if keys == "names" else ("0", "1")
    save_file({names[0]: tokens, names[1]: pos}, tmp_path / "in.safetensors")
    argv = ["run", path, "--inputs", str(tmp_path / "in.safetensors"), "--save-outputs",
            str(tmp_path / "out.safetensors"), "--steps", "3", "--json"] + (["--replay"] if replay else [])
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["outputs"][0]["shape"] == [1, 5, 64]
    with torch.no_grad():
        ref = copy.deepcopy(model)(tokens, pos)                     # fresh state, as the first call had
    got = load_file(tmp_path / "out.safetensors")
    assert list(got) == ["0"]
    torch.testing.assert_close(got["0"], ref, rtol=1e-5, atol=1e-5)


def test_random_inputs_follow_the_spec_and_seed(decoder, tmp_path, capsys):
    _, path = decoder
    outs = []
    for seed in (1, 1, 2):
        assert main(["run", path, "--seed", str(seed), "--steps", "1", "--save-outputs",
                     str(tmp_path / f"o{len(outs)}.safetensors")]) == 0
        outs.append(load_file(tmp_path / f"o{len(outs)}.safetensors")["0"])
    capsys.readouterr()
    torch.testing.assert_close(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])


def test_missing_file(tmp_path, capsys):
    first, hint = _fail(capsys, ["run", str(tmp_path / "missing.ost")])
    assert "No such file" in first and hint.startswith("Fix: check the path")


def test_not_a_program_file(tmp_path, capsys):
    bad = tmp_path / "bad.ost"
    bad.write_bytes(b"PK\x03\x04 not a program" * 20)
    first, hint = _fail(capsys, ["run", str(bad)])
    assert "not an ostinato program" in first and "ostinato export" in hint


def test_unknown_input_name(decoder, tmp_path, capsys):
    _, path = decoder
    save_file({"tokens": torch.zeros(1, 3, dtype=torch.int64), "position": torch.arange(3)},
              tmp_path / "in.safetensors")
    first, hint = _fail(capsys, ["run", path, "--inputs", str(tmp_path / "in.safetensors")])
    assert "no input named 'position'; the program takes tokens (or 0), pos (or 1)" in first
    assert hint.startswith("Fix:")


def test_missing_and_doubled_inputs(decoder, tmp_path, capsys):
    _, path = decoder
    save_file({"tokens": torch.zeros(1, 3, dtype=torch.int64)}, tmp_path / "a.safetensors")
    first, _ = _fail(capsys, ["run", path, "--inputs", str(tmp_path / "a.safetensors")])
    assert "missing input(s) pos (or 1)" in first
    save_file({"tokens": torch.zeros(1, 3, dtype=torch.int64), "0": torch.zeros(1, 3, dtype=torch.int64),
               "pos": torch.arange(3)}, tmp_path / "b.safetensors")
    first, _ = _fail(capsys, ["run", path, "--inputs", str(tmp_path / "b.safetensors")])
    assert "input 0 (tokens) is given twice" in first


@pytest.mark.parametrize("tokens, message", [
    (torch.zeros(1, 3), "input 0 (tokens): wrong dtype"),
    (torch.zeros(1, 9, dtype=torch.int64), "outside the range of"),
    (torch.zeros(3, dtype=torch.int64), "input 0 (tokens): wrong rank"),
])
def test_input_dtype_and_shape_mismatch(decoder, tmp_path, capsys, tokens, message):
    _, path = decoder
    save_file({"tokens": tokens, "pos": torch.arange(tokens.shape[-1])}, tmp_path / "in.safetensors")
    first, hint = _fail(capsys, ["run", path, "--inputs", str(tmp_path / "in.safetensors")])
    assert first.startswith(f"ostinato run: error: --inputs {tmp_path / 'in.safetensors'}: ")
    assert message in first and "ostinato inspect" in hint


def test_inputs_file_not_safetensors(decoder, tmp_path, capsys):
    _, path = decoder
    (tmp_path / "in.safetensors").write_bytes(b"hello world" * 4)
    first, hint = _fail(capsys, ["run", path, "--inputs", str(tmp_path / "in.safetensors")])
    assert "not a safetensors file" in first and "save_file" in hint
    first, hint = _fail(capsys, ["run", path, "--inputs", str(tmp_path / "none.safetensors")])
    assert "No such file" in first and hint.startswith("Fix: check the path")


def test_cuda_unavailable(decoder, capsys, monkeypatch):
    _, path = decoder
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    first, hint = _fail(capsys, ["run", path, "--device", "cuda"])
    assert "--device cuda: torch sees no CUDA device here" in first and "--device cpu" in hint
    first, hint = _fail(capsys, ["run", path, "--device", "tpu"])
    assert "--device tpu" in first and hint.startswith("Fix: use cpu, cuda or cuda:N")


def test_bad_steps(decoder, capsys):
    _, path = decoder
    first, hint = _fail(capsys, ["run", path, "--steps", "0"])
    assert "--steps 0" in first and hint == "Fix: --steps 10"


def test_verbose_raises(decoder, tmp_path):
    _, path = decoder
    with pytest.raises(FileNotFoundError):
        main(["run", str(tmp_path / "missing.ost"), "--verbose"])
    save_file({"tokens": torch.zeros(1, 3)}, tmp_path / "in.safetensors")
    with pytest.raises(InputError, match="missing input"):
        main(["--verbose", "run", path, "--inputs", str(tmp_path / "in.safetensors")])
    with pytest.raises(OstinatoError, match="--steps"):
        main(["run", path, "--steps", "-1", "--verbose"])


def test_console_script_runs(decoder):
    _, path = decoder
    script = os.path.join(os.path.dirname(sys.executable), "ostinato")
    r = subprocess.run([script, "run", path, "--replay", "--steps", "2", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["replay"] is True and report["outputs"][0]["shape"] == [1, 3, 64]
    r = subprocess.run([script, "run", path + ".missing"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("ostinato run: error: ")


def test_shared_error_formatting(decoder, capsys, monkeypatch):
    """A fix at the end of a one-line message becomes the hint; an error not of ostinato's is one line
    with exit code 1; KeyboardInterrupt exits 130."""
    from ostinato.cli import run as run_cli
    from ostinato.errors import BackendError
    _, path = decoder
    raised = []

    def load(*a, **kw):
        raise raised[-1]

    monkeypatch.setattr(run_cli, "load", load)
    raised.append(BackendError("kernel rms_norm failed to launch: ValueError: bad. Fix: set OSTINATO_X=1"))
    assert _fail(capsys, ["run", path]) == ("ostinato run: error: kernel rms_norm failed to launch: ValueError: bad",
                                            "Fix: set OSTINATO_X=1")
    raised.append(RuntimeError("CUDA error: out of memory\nmore detail"))
    first, hint = _fail(capsys, ["run", path], code=1)
    assert first == "ostinato run: error: RuntimeError: CUDA error: out of memory" and "--verbose" in hint
    with pytest.raises(RuntimeError):
        main(["run", path, "--verbose"])
    raised.append(KeyboardInterrupt())
    assert main(["run", path]) == 130
    assert capsys.readouterr().err == "ostinato run: interrupted\n"


@pytest.mark.mlx
@pytest.mark.parametrize("replay", [False, True])
def test_run_on_mlx_matches_eager(decoder, tmp_path, capsys, replay):
    """``ostinato run --device mlx``: the first call's outputs (saved) equal eager's."""
    model, path = decoder
    tokens, pos = _decode_inputs(5, gen_seed=13)
    save_file({"tokens": tokens, "pos": pos}, tmp_path / "in.safetensors")
    argv = ["run", path, "--device", "mlx", "--inputs", str(tmp_path / "in.safetensors"), "--save-outputs",
            str(tmp_path / "out.safetensors"), "--steps", "3", "--json"] + (["--replay"] if replay else [])
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"].startswith("mlx:") and r["replay"] == replay
    with torch.no_grad():
        expected = copy.deepcopy(model)(tokens, pos)
    torch.testing.assert_close(load_file(tmp_path / "out.safetensors")["0"], expected, rtol=1e-5, atol=1e-5)
