"""engine.step_stats: each step counted once, under the kind its chunks make it."""
import pytest

from pdserve.engine.step_stats import StepStats
from pdserve.protocol.step_kinds import STEP_KINDS, step_kind


@pytest.mark.parametrize("num_decodes, num_prompt_tokens, kind", [
    (8, 0, "decode"), (0, 300, "prompt"), (8, 40, "mixed"), (0, 0, None)])
def test_a_step_is_named_by_its_chunks(num_decodes, num_prompt_tokens, kind):
    assert step_kind(num_decodes, num_prompt_tokens) == kind


def test_figures_add_up_every_step_under_its_kind_and_skip_empty_steps():
    stats = StepStats()
    stats.observe(num_decodes=0, num_prompt_tokens=300, seconds=0.25)
    stats.observe(num_decodes=4, num_prompt_tokens=0, seconds=0.02)
    stats.observe(num_decodes=4, num_prompt_tokens=0, seconds=0.03)
    stats.observe(num_decodes=5, num_prompt_tokens=32, seconds=0.07)
    stats.observe(num_decodes=0, num_prompt_tokens=0, seconds=0.001)
    figures = stats.figures()
    assert {kind: figures[f"{kind}_steps"] for kind in STEP_KINDS} == {"decode": 2, "mixed": 1, "prompt": 1}
    assert figures["decode_steps_s"] == pytest.approx(0.05)
    assert figures["mixed_steps_s"] == pytest.approx(0.07)
    assert figures["prompt_steps_s"] == pytest.approx(0.25)
    assert figures["computed_prompt_tokens"] == 332
    assert figures["computed_decode_tokens"] == 13


def test_the_figures_are_fields_a_replica_reports_to_the_registry():
    from pdserve.cluster.registry_entry import LOAD_FIELDS, ReplicaInfo

    figures = StepStats().figures()
    assert figures.keys() <= LOAD_FIELDS
    assert all(hasattr(ReplicaInfo, name) for name in figures)
