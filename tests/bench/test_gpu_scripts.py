"""scripts/gpu_suite_parts.sh over scripts/gpu_jobs.sh: one suite part per GPU, each job seeing its own GPU,
and a refusal when there are fewer GPUs than parts. Run with a stand-in nvidia-smi and gpu_suite.sh."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("taskset") is None, reason="gpu_jobs.sh pins jobs with taskset")


def _tree(tmp_path, gpus: int):
    """A copy of the two scripts, a gpu_suite.sh that records its arguments and GPU, and an nvidia-smi
    listing ``gpus`` GPUs."""
    scripts, bin_ = tmp_path / "repo" / "scripts", tmp_path / "bin"
    scripts.mkdir(parents=True)
    bin_.mkdir()
    for name in ("gpu_jobs.sh", "gpu_suite_parts.sh"):
        shutil.copy(os.path.join(ROOT, "scripts", name), scripts / name)
    (scripts / "gpu_suite.sh").write_text('echo "args=$* gpu=$CUDA_VISIBLE_DEVICES timeout=$SUITE_TIMEOUT"\n')
    smi = bin_ / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f'echo "GPU {i}: stand-in"\n' for i in range(gpus)))
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return scripts / "gpu_suite_parts.sh", dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}",
                                                 OUT=str(tmp_path / "out"))


def test_each_part_runs_on_its_own_gpu(tmp_path):
    script, env = _tree(tmp_path, gpus=2)     # two jobs: CI has two cores, one each
    p = subprocess.run(["bash", str(script), "36", "4", "9"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    for gpu, part in enumerate((4, 9)):
        log = (tmp_path / "out" / f"part{part}.log").read_text()
        assert log.strip() in (f"args={part}/36 --startup-configs representative gpu={gpu} timeout={t}"
                               for t in (544, 545)), log


def test_parts_one_after_the_other_on_one_gpu(tmp_path):
    """``16+17`` runs both parts on the first GPU, the second until the deadline the first left; a failing
    part does not stop the next, and the job's exit code is the failing part's."""
    script, env = _tree(tmp_path, gpus=2)
    stand_in = script.parent / "gpu_suite.sh"
    stand_in.write_text(stand_in.read_text() + '[ "$1" = 16/36 ] && exit 3\nsleep 1\n')
    p = subprocess.run(["bash", str(script), "36", "16+17", "18"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 3, (p.stdout, p.stderr)
    first, second = (tmp_path / "out" / "part16+17.log").read_text().split("\n")[:2]
    assert first.startswith("args=16/36 ") and " gpu=0 " in first and first.endswith(("timeout=545", "timeout=544"))
    assert second.startswith("args=17/36 ") and " gpu=0 " in second
    assert 0 < int(second.rsplit("=", 1)[1]) <= 545
    assert (tmp_path / "out" / "part18.log").read_text().startswith("args=18/36 --startup-configs representative gpu=1")
    p = subprocess.run(["bash", str(script), "36", "16+x"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "'16+x' is not K or K1+K2" in p.stderr


def test_more_parts_than_gpus_is_refused(tmp_path):
    script, env = _tree(tmp_path, gpus=1)
    p = subprocess.run(["bash", str(script), "36", "4", "5"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "2 jobs need 2 GPUs" in p.stderr
    assert not (tmp_path / "out" / "part4.log").exists()
    p = subprocess.run(["bash", str(script), "36"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "usage" in p.stderr


def test_a_cpuset_not_starting_at_zero_and_out_left_unset(tmp_path):
    """Under a cpuset of CPU 1 alone the job is pinned to CPU 1 (not 0, which taskset would refuse), and
    with OUT unset the default folder gets the part's log."""
    script, env = _tree(tmp_path, gpus=1)
    env.pop("OUT")
    default = tmp_path / "default-out"
    env["TMPDIR"] = str(tmp_path)
    text = (script.parent / "gpu_jobs.sh").read_text().replace("/tmp/ostinato-jobs", str(default))
    (script.parent / "gpu_jobs.sh").write_text(text)
    p = subprocess.run(["taskset", "-c", "1", "bash", str(script), "36", "7"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "(GPU 0, CPUs 1)" in p.stdout, p.stdout
    assert (default / "part7.log").read_text().startswith("args=7/36")


def test_a_part_past_the_deadline_is_not_started(tmp_path):
    """When the first part of ``16+17`` uses up the group's time, the second is not started (``timeout 0``
    would run it without a limit, a negative one fails), and the job reports 124, a timeout."""
    script, env = _tree(tmp_path, gpus=1)
    stand_in = script.parent / "gpu_suite.sh"
    stand_in.write_text(stand_in.read_text() + '[ "$1" = 16/36 ] && sleep 3\nexit 0\n')
    p = subprocess.run(["bash", str(script), "36", "16+17"], env=dict(env, SUITE_TIMEOUT="2"), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 124, (p.stdout, p.stderr)
    log = (tmp_path / "out" / "part16+17.log").read_text().splitlines()
    assert log[0].startswith("args=16/36 ") and log[0].endswith(("timeout=2", "timeout=1")), log
    assert log[1:] == ["part 17 not started: the deadline passed"], log
