"""The shared core: model, paged KV pool, scheduler, sampler. No gRPC here.

`LLM` and `SamplingParams` load lazily, so that the pure-policy modules (block allocator,
scheduler) import without pulling in torch.
"""

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from pdserve.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from pdserve.protocol.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'pdserve.engine' has no attribute {name!r}")
