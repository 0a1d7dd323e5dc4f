"""scripts/gpu_check.sh, checked where no GPU is: it parses, every step runs under its own timeout
within eight minutes, every `pdserve bench` command it runs takes the flags it is given, every
pytest step names folders that exist, and the roofline step passes in its CPU mode. What the
steps measure on a GPU is not proven here."""
import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.bench.cli import add_arguments as add_bench_arguments

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ("env", "versions", "kernels", "engine", "bandwidth", "roofline", "ipc_same_gpu", "ipc_cross_gpu")
BUDGET_S = 8 * 60


def script_steps() -> dict[str, tuple[int, list[str]]]:
    """step -> (timeout in seconds, the command's words after the interpreter)."""
    return {name: (int(timeout_s), command.split()[1:])
            for name, timeout_s, command in re.findall(r"run_step (\w+) (\d+) (.*)", SCRIPT.read_text())}


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_step_has_a_timeout_and_the_run_fits_in_eight_minutes():
    steps = script_steps()
    assert set(steps) == set(STEPS)
    assert "GPU_CHECK_BUDGET_S:-480" in SCRIPT.read_text()
    assert all(0 < timeout_s <= BUDGET_S for timeout_s, _ in steps.values())


@pytest.mark.parametrize("words", [words for _, words in script_steps().values() if words[:2] == ["-m", "pdserve"]],
                         ids=lambda words: " ".join(words[2:4]))
def test_every_bench_step_accepts_its_flags(words):
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    parser.parse_args(words[3:])  # exits on a flag it does not take


def test_every_pytest_step_runs_folders_that_hold_tests():
    folders = [words[-1] for _, words in script_steps().values() if words[:2] == ["-m", "pytest"]]
    assert folders == ["tests/kernels", "tests/gpu"]
    assert all(list((ROOT / folder).glob("test_*.py")) for folder in folders)


def test_the_roofline_step_runs_on_the_tiny_model_on_cpu(tiny_model):
    result = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench", "decode-step", "--device", "cpu", "--model", tiny_model(),
         "--batch-sizes", "2", "--context-len", "32", "--steps", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "roofline" in result.stdout
