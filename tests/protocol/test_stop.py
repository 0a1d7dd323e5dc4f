"""check_stop: EOS, stop token ids, stop strings and max_tokens, with vLLM's text rules."""
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.stop import StopDecision, check_stop

EOS = 99


def test_running_request_keeps_going():
    assert check_stop(SamplingParams(max_tokens=5), [5, 6], "ab", EOS, 1) is None


def test_eos_stops_and_its_text_is_dropped():
    decision = check_stop(SamplingParams(), [5, EOS], "hi</s>", EOS, 4)
    assert decision == StopDecision("stop", None, "hi")


def test_eos_with_empty_text_keeps_the_text():
    assert check_stop(SamplingParams(), [5, EOS], "hi", EOS, 0) == StopDecision("stop", None, "hi")


def test_ignore_eos_keeps_going_past_eos():
    assert check_stop(SamplingParams(ignore_eos=True), [5, EOS], "hi", EOS, 0) is None


def test_no_eos_token_means_no_eos_stop():
    assert check_stop(SamplingParams(), [5, EOS], "hi", None, 0) is None


def test_stop_token_id_stops_with_the_id_as_reason_and_its_text_dropped():
    params = SamplingParams(stop_token_ids=[9, 11])
    assert check_stop(params, [5, 11], "ab\n", EOS, 1) == StopDecision("stop", 11, "ab")


def test_stop_token_id_applies_even_with_ignore_eos():
    params = SamplingParams(stop_token_ids=[11], ignore_eos=True)
    assert check_stop(params, [11], "x", EOS, 1) == StopDecision("stop", 11, "")


def test_include_stop_str_in_output_keeps_the_stop_token_text():
    params = SamplingParams(stop_token_ids=[11], include_stop_str_in_output=True)
    assert check_stop(params, [5, 11], "ab\n", EOS, 1) == StopDecision("stop", 11, "ab\n")


def test_stop_string_truncates_before_the_string():
    params = SamplingParams(stop=["###"])
    assert check_stop(params, [1, 2], "hello###world", EOS, 8) == StopDecision("stop", "###", "hello")


def test_stop_string_kept_when_included():
    params = SamplingParams(stop=["###"], include_stop_str_in_output=True)
    decision = check_stop(params, [1, 2], "hello###world", EOS, 8)
    assert decision == StopDecision("stop", "###", "hello###")


def test_stop_string_spanning_two_deltas_is_found_when_it_completes():
    params = SamplingParams(stop=["STOP"])
    assert check_stop(params, [1], "abcST", EOS, 2) is None
    assert check_stop(params, [1, 2], "abcSTOP and more", EOS, 11) == StopDecision("stop", "STOP", "abc")


def test_stop_string_wholly_before_the_new_text_is_not_searched():
    # Text outside the window a new token can affect is never rescanned.
    params = SamplingParams(stop=["ab"])
    assert check_stop(params, [1, 2], "ab" + "x" * 10, EOS, 3) is None


def test_no_new_text_means_no_stop_string_check():
    assert check_stop(SamplingParams(stop=["a"]), [1], "a", EOS, 0) is None


def test_earliest_stop_string_wins():
    params = SamplingParams(stop=["world", "lo"])
    assert check_stop(params, [1], "hello world", EOS, 11) == StopDecision("stop", "lo", "hel")


def test_max_tokens_finishes_with_length_and_full_text():
    params = SamplingParams(max_tokens=3)
    assert check_stop(params, [4, 5], "ab", EOS, 1) is None
    assert check_stop(params, [4, 5, 6], "abc", EOS, 1) == StopDecision("length", None, "abc")


def test_stop_beats_length_on_the_same_token():
    assert check_stop(SamplingParams(max_tokens=2), [4, EOS], "a", EOS, 0).finish_reason == "stop"
    params = SamplingParams(max_tokens=2, stop=["b"])
    assert check_stop(params, [4, 5], "ab", EOS, 1) == StopDecision("stop", "b", "a")
    params = SamplingParams(max_tokens=2, stop_token_ids=[5])
    assert check_stop(params, [4, 5], "ab", EOS, 1) == StopDecision("stop", 5, "a")


def test_before_min_tokens_neither_eos_nor_stop_tokens_stop():
    params = SamplingParams(max_tokens=5, min_tokens=3, stop_token_ids=[9])
    assert check_stop(params, [5, EOS], "a", EOS, 1) is None
    assert check_stop(params, [5, 9], "a", EOS, 1) is None
    assert check_stop(params, [5, 6, EOS], "ab", EOS, 0) == StopDecision("stop", None, "ab")
    assert check_stop(params, [5, 6, 9], "abc", EOS, 1) == StopDecision("stop", 9, "ab")


def test_stop_strings_are_searched_only_past_min_tokens():
    params = SamplingParams(max_tokens=6, min_tokens=2, stop=["x"])
    assert check_stop(params, [5, 6], "ax", EOS, 1) is None
    assert check_stop(params, [5, 6, 7], "axb", EOS, 1) is None  # "x" came before, not in the new text
    assert check_stop(params, [5, 6, 7], "abx", EOS, 1) == StopDecision("stop", "x", "ab")


def test_min_tokens_equal_to_max_tokens_still_ends_on_length():
    params = SamplingParams(max_tokens=2, min_tokens=2)
    assert check_stop(params, [5, 6], "ab", EOS, 1) == StopDecision("length", None, "ab")
