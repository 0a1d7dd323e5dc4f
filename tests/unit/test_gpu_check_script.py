"""scripts/gpu_check.sh, checked where no GPU is: it parses, it runs every step the GPU path needs
under its own timeout, every script it calls takes the flags it is given, and the checks that
have a CPU mode pass in it. What the steps measure on a GPU is not proven here."""
import contextlib
import io
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ("env", "versions", "kernels", "warm_up", "device_guard", "bandwidth", "roofline", "ipc_same_gpu", "ipc_cross_gpu", "up", "launch_sweep")
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


@pytest.mark.parametrize("command", python_commands(), ids=lambda command: command[0])
def test_every_python_step_accepts_its_flags(command):
    if command[0] == "-m":
        return  # pytest
    script, *flags = command
    parser_help = script_help(ROOT / script)
    for flag in flags:
        if flag.startswith("--"):
            assert flag in parser_help, (script, flag)


def script_help(script: Path) -> str:
    """What `python SCRIPT --help` prints, run in this process: every script parses its flags
    before anything else, so a fresh interpreter for each (seconds of imports) adds nothing; the
    tests below run two of them as scripts."""
    argv, path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(script), "--help"], [str(script.parent)]  # as `python SCRIPT` sets them
    try:
        with contextlib.redirect_stdout(io.StringIO()) as printed, pytest.raises(SystemExit) as exited:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    assert exited.value.code in (0, None), printed.getvalue()
    return printed.getvalue()


def test_the_roofline_script_runs_on_a_tiny_shape_on_cpu():
    result = subprocess.run(
        [sys.executable, "scripts/decode_step_roofline.py", "--tiny", "--device", "cpu", "--batch-sizes", "2",
         "--context-len", "32", "--iters", "1", "--copy-mib", "16"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "roofline" in result.stdout


def test_the_launch_sweep_runs_on_a_tiny_grid_on_cpu(tmp_path):
    result = subprocess.run(
        [sys.executable, "scripts/decode_launch_sweep.py", "--device", "cpu", "--batch-sizes", "1",
         "--context-lens", "32,48", "--split-tokens", "default,16", "--tile-tokens", "default", "--num-warps", "4",
         "--num-stages", "3", "--iters", "1", "--out", str(tmp_path / "sweep.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "(default)" in result.stdout
    timed = json.loads((tmp_path / "sweep.json").read_text())
    assert [launch["split_tokens"] for launch in timed] == [None, 16]
    assert all(set(launch["seconds"]) == {"1x32", "1x48"} for launch in timed)


@pytest.mark.e2e  # starts `pdserve up`: Redis, a prefill, a decode and a gateway
@pytest.mark.slow
def test_the_up_check_passes_on_cpu():
    result = subprocess.run([sys.executable, "scripts/gpu_up_check.py", "--device", "cpu"],
                            cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("ok   ") == 3
