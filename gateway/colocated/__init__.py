"""`pdserve serve`: the public fronts over one in-process engine (prefill and decode in one batch)."""
