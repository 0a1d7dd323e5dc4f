"""`pdserve bench decode-kernel` runs end to end on a small shape (a smoke test, no timing)."""
import subprocess
import sys

import pytest

from pdserve.kernels import cpu_decode_attention


@pytest.mark.parametrize("dtype, num_layers", [("float32", 1), ("bfloat16", 2)])
def test_cpu_decode_kernel_benchmark_runs(dtype, num_layers):
    if cpu_decode_attention.load() is None:
        pytest.skip("no C compiler: the compiled CPU kernel is unavailable")
    result = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench", "decode-kernel", "--num-seqs", "3", "--min-context", "1",
         "--max-context", "40", "--num-blocks", "32", "--repeats", "2", "--dtype", dtype,
         "--num-layers", str(num_layers)],
        capture_output=True, text=True, timeout=120, check=True)
    assert "kernel" in result.stdout and "reference" in result.stdout
