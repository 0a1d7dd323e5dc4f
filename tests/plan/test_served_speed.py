"""The served speed's anchor: which of the profile's single requests it is read against."""
from pdserve.planner.profile import ServingOverhead
from pdserve.planner.served_speed import anchor_shape, profile_anchor_ttft_s

from tests.plan.profiles import make_profile


def _single(prompt_len: int, output_len: int, ttft_s: float) -> dict:
    return {"kind": "single", "prompt_len": prompt_len, "output_len": output_len, "ttft_s": ttft_s, "e2el_s": 1.0}


def test_the_anchor_is_the_longest_single_prompt_with_its_shortest_output():
    samples = [_single(64, 8, 0.01), _single(64, 64, 0.01), _single(512, 64, 0.5), _single(512, 8, 0.2),
               _single(512, 8, 0.3), _single(512, 8, 0.1), {**_single(1024, 8, 9.0), "kind": "staggered"}]
    profile = make_profile(serving=ServingOverhead(samples=samples))
    assert anchor_shape(profile) == (512, 8)
    assert profile_anchor_ttft_s(profile) == 0.2  # the median of that shape's singles


def test_a_profile_without_single_requests_has_no_anchor():
    assert anchor_shape(make_profile()) is None
