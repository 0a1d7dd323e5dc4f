"""scripts/gpu_check.sh, checked where no GPU is: it parses, it runs every step the GPU path needs
under its own timeout, every command it runs takes the flags it is given, and the steps that have
a CPU mode pass in it. What the steps measure on a GPU is not proven here."""
import argparse
import contextlib
import io
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.bench.cli import add_arguments as add_bench_arguments

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ("env", "versions", "kernels", "warm_up", "device_guard", "bandwidth", "roofline", "ipc_same_gpu",
         "ipc_cross_gpu", "up")
BUDGET_S = 8 * 60


def script_steps() -> dict[str, tuple[int, list[str]]]:
    """step -> (timeout in seconds, the command's words after the interpreter)."""
    steps = {}
    for match in re.finditer(r"run_step (\w+) (\d+) (.*)", SCRIPT.read_text()):
        name, timeout_s, command = match.groups()
        steps[name] = (int(timeout_s), command.split())
    return steps


def python_commands() -> list[list[str]]:
    return [words[1:] for _, words in script_steps().values() if words[0] == '"$python"']


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_step_has_a_timeout_and_the_run_fits_in_eight_minutes():
    steps = script_steps()
    assert set(steps) == set(STEPS)
    assert "GPU_CHECK_BUDGET_S:-480" in SCRIPT.read_text()
    assert all(0 < timeout_s <= BUDGET_S for timeout_s, _ in steps.values())


@pytest.mark.parametrize("command", python_commands(), ids=lambda command: " ".join(command[:4]))
def test_every_python_step_accepts_its_flags(command):
    if command[:2] == ["-m", "pytest"]:
        return
    if command[:3] == ["-m", "pdserve", "bench"]:
        parser = argparse.ArgumentParser()
        add_bench_arguments(parser)
        parser.parse_args(command[3:])  # exits on a flag it does not take
        return
    script, *flags = command
    parser_help = script_help(ROOT / script)
    for flag in flags:
        if flag.startswith("--"):
            assert flag in parser_help, (script, flag)


def script_help(script: Path) -> str:
    """What `python SCRIPT --help` prints, run in this process: every script parses its flags
    before anything else, so a fresh interpreter for each (seconds of imports) adds nothing."""
    argv, path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(script), "--help"], [str(script.parent)]  # as `python SCRIPT` sets them
    try:
        with contextlib.redirect_stdout(io.StringIO()) as printed, pytest.raises(SystemExit) as exited:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    assert exited.value.code in (0, None), printed.getvalue()
    return printed.getvalue()


def test_the_roofline_step_runs_on_the_tiny_model_on_cpu(tiny_model):
    result = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench", "decode-step", "--device", "cpu", "--model", tiny_model(),
         "--batch-sizes", "2", "--context-len", "32", "--steps", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "roofline" in result.stdout


@pytest.mark.e2e  # starts `pdserve up`: Redis, a prefill, a decode and a gateway
@pytest.mark.slow
def test_the_up_check_passes_on_cpu():
    result = subprocess.run([sys.executable, "scripts/gpu_up_check.py", "--device", "cpu"],
                            cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("ok   ") == 3
