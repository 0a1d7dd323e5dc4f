"""The tiny random model that tests and `--model tiny` use: a small Hugging Face folder written
from a seed (model.py), with its byte-level tokenizer (tokenizer.py).

Writing it needs torch (the parameter shapes come from transformers' own model classes), so this
is the one heavy corner of `pdserve.checkpoints`, and no module of that package imports it:
`--model tiny` writes the folder in a child process (`python -m pdserve.checkpoints.tiny OUT`,
from tiny_model_cache), so resolving a model never loads torch in the resolving process.
"""
