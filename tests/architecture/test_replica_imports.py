"""A replica's engine (one that leaves text to its gateway and is given prompts as ids) never
loads transformers or llguidance, which would add about 130 MB to each replica's resident memory,
until its first structured output; and no engine loads torch._dynamo or Triton on a CPU (about
140 MiB more)."""
import subprocess
import sys

ENGINE = """
import sys
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.structured_output import StructuredOutput

engine = LLMEngine(EngineConfig(model={model_dir!r}, detokenize=False, num_gpu_blocks=16))
engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0))
while engine.has_unfinished_requests():
    engine.step()
print(sorted({{"transformers", "llguidance", "torch._dynamo", "triton"}} & set(sys.modules)))
engine.add_request("b", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0,
                                                  structured_output=StructuredOutput(choice=("x", "y"))))
print(sorted({{"transformers", "llguidance", "torch._dynamo", "triton"}} & set(sys.modules)))
"""


def test_a_replica_engine_loads_neither_transformers_nor_llguidance_until_a_structured_output_nor_dynamo(
        tiny_model):
    script = ENGINE.format(model_dir=tiny_model())
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    serving, structured = result.stdout.strip().splitlines()[-2:]
    assert serving == "[]"
    assert structured == "['llguidance', 'transformers']"
