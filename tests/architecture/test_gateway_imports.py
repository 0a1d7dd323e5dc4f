"""The disaggregated gateway process never loads torch: not by importing its modules, and not by
loading its model folder's tokenizer and config. The colocated server needs the engine and may."""
import subprocess
import sys

GATEWAY_MODULES = ("pdserve.gateway.disaggregated.main", "pdserve.gateway.front.grpc_service", "pdserve.gateway.front.http_api", "pdserve.gateway.disaggregated.frontend")


def torch_loaded_after(code: str) -> bool:
    script = f"{code}\nimport sys\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return result.stdout.strip().splitlines()[-1] == "True"


def test_importing_the_gateway_loads_no_torch():
    assert not torch_loaded_after("\n".join(f"import {module}" for module in GATEWAY_MODULES))


def test_loading_the_gateways_model_folder_loads_no_torch(tiny_model):
    model_dir = tiny_model()
    code = (
        "from pdserve.engine.config import ModelConfig\n"
        "from pdserve.protocol.tokenizer import load_tokenizer\n"
        "from pdserve.gateway.front.tokenization import PromptBuilder\n"
        f"config = ModelConfig.from_dir({model_dir!r})\n"
        f"prompts = PromptBuilder(load_tokenizer({model_dir!r}), {model_dir!r}, config.vocab_size, 64)\n"
        "prompts.tokenizer.decode(prompts.tokenizer.encode('hello'))\n"
        "prompts.tokenizer.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True)\n"
    )
    assert not torch_loaded_after(code)


def test_resolving_the_tiny_model_writes_it_in_a_child_and_loads_no_torch(tmp_path):
    code = (
        "from pdserve.checkpoints.model_ref import resolve_model\n"
        f"resolved = resolve_model('tiny', {{'XDG_CACHE_HOME': {str(tmp_path)!r}}})\n"
        "assert (resolved.model_dir / 'model.safetensors').is_file(), resolved\n"
    )
    assert not torch_loaded_after(code)
