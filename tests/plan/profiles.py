"""A small synthetic profile: round step times so that expected answers can be written by hand."""

from pdserve.planner.profile import DecodeFit, PrefillFit, Profile


def make_profile(prefill=PrefillFit(0.010, 0.0001, 0.0), decode=DecodeFit(0.005, 0.001, 0.0),
                 max_num_batched_tokens=2048, transfer_gb_per_s=1.0, kv_bytes_per_token=1000) -> Profile:
    return Profile(hardware={"device": "cpu", "name": "test"}, model={"dir": "test"},
                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=256,
                   kv_bytes_per_token=kv_bytes_per_token, transfer_gb_per_s=transfer_gb_per_s,
                   prefill=prefill, decode=decode)
