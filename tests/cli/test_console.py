"""Every console script ends Ctrl-C with one line (status 130) and refuses a bad
OMP_NUM_THREADS in one line (issue 37, items 4 and 8; issue 41: pe-bench-place's Ctrl-C was a
30-line traceback), and a run interrupted anywhere resumes (experiments/kill_anywhere.py
interrupts it at random moments)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from pe_bench.cli import bench, check, place, report
from pe_bench.cli import console as console_module
from pe_bench.cli.console import INTERRUPTED, RESUME, console
from tests.helpers import TINY, overridden


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("value", ["0", "abc", "", "-2"])
def test_a_bad_omp_num_threads_is_one_line(value, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(SystemExit) as done, console("pe-bench"):
        pass
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"pe-bench: error: OMP_NUM_THREADS={value!r} is not a number of threads; allowed: a "
        "whole number >= 1, e.g. OMP_NUM_THREADS=2, or unset (every core)\n"
    )


@pytest.mark.parametrize("value", ["1", "2", "4,2"])
def test_a_number_of_threads_is_allowed(value, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with console("pe-bench"):
        pass


@pytest.mark.parametrize(
    ("script", "argv", "target"),
    [
        (report, ["results/quick"], "build_report"),
        (check, ["rope", "--no-cost"], "check_scheme"),
        (place, ["my_pe", "--plugin", "my_pe"], "place"),
    ],
    ids=["report", "check", "place"],
)
def test_ctrl_c_is_one_line_with_status_130(script, argv, target, monkeypatch, capsys):
    monkeypatch.setattr(script, target, interrupt)
    with pytest.raises(SystemExit) as done:
        script.main(argv)
    assert done.value.code == INTERRUPTED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": interrupted; " in err and "Traceback" not in err


def test_place_ends_silently_with_its_sweep_s_interruption(monkeypatch, capsys):
    """Ctrl-C reaches the sweep pe-bench-place runs too: the sweep says it, not both."""

    class Sweep:
        calls = 0

        def __init__(self, args):
            pass

        def wait(self):
            Sweep.calls += 1
            if Sweep.calls == 1:
                raise KeyboardInterrupt
            return INTERRUPTED

    monkeypatch.setattr(place.subprocess, "Popen", Sweep)
    with pytest.raises(SystemExit) as done:
        place.run_sweep(["pe-bench"])
    assert done.value.code == INTERRUPTED and capsys.readouterr().err == ""


SLOW_EXIT = """
import atexit, sys, threading, time
from pathlib import Path

def linger():
    Path(sys.argv[1], "exiting").touch()
    time.sleep(600)

def main():
    Path(sys.argv[1], "ready").touch()
    try:
        time.sleep(600)
    finally:
        if sys.argv[2] == "thread":  # joined in the shutdown
            threading.Thread(target=linger).start()
        else:  # e.g. a tracker's upload
            atexit.register(linger)
"""


def wait_for_file(proc: subprocess.Popen, path, timeout: float = 600) -> None:
    """Until ``path`` exists (a busy machine takes minutes to start a Python)."""
    start = time.time()
    while not path.exists():
        assert proc.poll() is None and time.time() - start < timeout, proc.poll()
        time.sleep(0.05)


@pytest.mark.parametrize("lingering", ["thread", "exit hook"])
def test_a_second_ctrl_c_while_exiting_ends_it_at_once_and_silently(lingering, tmp_path):
    """Ctrl-C once: the line and status 130; Ctrl-C again while Python shuts down (joining a
    thread, running an exit hook): nothing more, the status still 130, and no wait. Before,
    the shutdown printed a KeyboardInterrupt traceback after the line."""
    (tmp_path / "slow_exit.py").write_text(SLOW_EXIT)
    code = (  # Ctrl-C as from a shell: pytest-xdist's workers ignore it, and children inherit that
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from pe_bench.cli.console import launch; sys.exit(launch('x', 'slow_exit'))"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}"}
    command = [sys.executable, "-c", code, str(tmp_path), lingering]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_file(proc, tmp_path / "ready")
        proc.send_signal(signal.SIGINT)
        wait_for_file(proc, tmp_path / "exiting")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)  # not the 600 s the shutdown would take
    finally:
        proc.kill()  # a failed test's process
    assert proc.returncode == INTERRUPTED
    assert err.splitlines() == [f"x: interrupted; {RESUME}"]


def wait_for(proc: subprocess.Popen, log, text: str, timeout: float = 300) -> None:
    start = time.time()
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() - start < timeout, log.read_text()[-3000:]
        time.sleep(0.2)


def as_from_a_shell() -> None:
    """In the child: Ctrl-C acts as for a command typed in a shell. pytest started in the
    background (``nohup bash .ci/run &``) ignores SIGINT, and a child inherits an ignored
    signal: the run slept through the test's Ctrl-C and trained to its end (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow  # a run started, interrupted in training, and rerun
def test_ctrl_c_in_training_is_one_line_and_the_rerun_resumes(tmp_path):
    args = overridden(*TINY, "train.steps=400", "train.ckpt_every=20", "train.log_every=20")
    command = [sys.executable, "-m", "pe_bench.cli", *args, f"out_root={tmp_path}"]
    log = tmp_path / "log.txt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=as_from_a_shell
        )
        wait_for(proc, log, ": step 40/400")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == INTERRUPTED
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert text.splitlines()[-1] == (
        "pe-bench: interrupted; rerun the same command to resume (finished records and "
        "checkpoints are kept)"
    )
    rerun = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resumed at step" in rerun.stdout + rerun.stderr


def raise_caused_by_ctrl_c(how: str) -> None:
    """An error that a Ctrl-C caused: raised while its ``KeyboardInterrupt`` unwound
    (``__context__``), from it (``__cause__``), or a step further down the chain."""
    try:
        raise KeyboardInterrupt  # the Ctrl-C, while an extension loads
    except KeyboardInterrupt as ctrl_c:
        if how == "cause":
            raise ImportError("cannot import name '_C' (partially initialized)") from ctrl_c
        if how == "context":
            raise ImportError("cannot import name '_C' (partially initialized)")  # noqa: B904
        try:
            raise ImportError("cannot import name '_C' (partially initialized)")
        except ImportError as err:
            raise RuntimeError("pe_bench.positions failed to load") from err


@pytest.mark.parametrize("how", ["cause", "context", "deeper"])
def test_an_error_a_ctrl_c_caused_is_the_ctrl_c_s_one_line(how, capsys):
    """A Ctrl-C while an extension imports can surface as another error (torch's ImportError
    of a partially initialised module): the KeyboardInterrupt in its chain makes it the
    Ctrl-C's one line and status 130, not a traceback; an error without one is raised."""
    with pytest.raises(SystemExit) as done, console("pe-bench"):
        raise_caused_by_ctrl_c(how)
    assert done.value.code == INTERRUPTED
    assert capsys.readouterr().err == f"pe-bench: interrupted; {RESUME}\n"
    with pytest.raises(ImportError, match="no module"), console("pe-bench"):
        raise ImportError("no module named 'x'")


TORN_IMPORT = """
from tests.cli.test_console import raise_caused_by_ctrl_c

raise_caused_by_ctrl_c("context")
"""


def test_launch_answers_a_ctrl_c_during_an_import_with_its_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "torn_import.py").write_text(TORN_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(console_module, "end_on_ctrl_c", lambda status: None)  # pytest's SIGINT
    with pytest.raises(SystemExit) as done:
        console_module.launch("x", "torn_import")
    assert done.value.code == INTERRUPTED
    assert capsys.readouterr().err == f"x: interrupted; {RESUME}\n"


def test_pe_bench_answers_a_ctrl_c_surfaced_in_its_job_with_its_one_line(monkeypatch, capsys):
    """pe-bench hands an error of its job to Hydra's report (a traceback, status 1), but one
    that a Ctrl-C caused to console's one line."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # run_command sets it: restored
    monkeypatch.setattr(logging, "raiseExceptions", True)  # and this
    monkeypatch.setattr(bench, "check_command", lambda argv: None)
    monkeypatch.setattr(bench, "hydra_main", lambda: raise_caused_by_ctrl_c("context"))
    monkeypatch.setattr(sys, "argv", ["pe-bench", "pe=nope"])
    with pytest.raises(SystemExit) as done:
        bench.main()
    assert done.value.code == INTERRUPTED
    assert capsys.readouterr().err == f"pe-bench: interrupted; {RESUME}\n"


def test_a_plugin_import_a_ctrl_c_tore_is_the_ctrl_c_not_a_bad_plugin(
    tmp_path, monkeypatch, capsys
):
    """load_plugin said "does not import" (status 2) for a module whose import the user's
    Ctrl-C tore; the command line's check loads the plugin, so this is what pe-bench said."""
    (tmp_path / "torn_plugin.py").write_text(TORN_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["pe-bench", "+pe.plugin=torn_plugin", *TINY])
    with pytest.raises(SystemExit) as done:
        bench.main()
    assert done.value.code == INTERRUPTED
    assert capsys.readouterr().err == f"pe-bench: interrupted; {RESUME}\n"


def test_a_ctrl_c_surfaced_in_a_sweep_s_job_ends_the_sweep(tmp_path, monkeypatch, capsys):
    """A sweep logged such a job as failed and went on to the next job."""
    jobs = []

    def torn_job(cfg, out_dir, sweep):
        jobs.append(cfg.pe.name)
        raise_caused_by_ctrl_c("cause")

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # run_command sets it: restored
    monkeypatch.setattr(logging, "raiseExceptions", True)  # and this
    monkeypatch.setattr(bench, "check_command", lambda argv: None)
    monkeypatch.setattr(bench, "run", torn_job)
    argv = ["-m", "pe=rope,alibi", *TINY, f"out_root={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["pe-bench", *argv])
    with pytest.raises(SystemExit) as done:
        bench.main()
    assert done.value.code == INTERRUPTED and jobs == ["rope"]
    assert capsys.readouterr().err.endswith(f"pe-bench: interrupted; {RESUME}\n")
