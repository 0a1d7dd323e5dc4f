"""Where the checkpoints pdserve serves come from, when no model hub is at hand: the random tiny
models that tests and benchmarks write, and the user cache they live in. It sits just above the
engine and below everything that resolves a `--model` flag."""
