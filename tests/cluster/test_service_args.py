"""The flags every service command shares: one rule for the model id clients use."""
import argparse

import pytest

from pdserve.cluster.service_args import add_served_model_name_argument, served_model_name


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    add_served_model_name_argument(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("model_dir", ["/models/Llama-3.1-8B", "/models/Llama-3.1-8B/", "Llama-3.1-8B"])
def test_the_served_model_name_defaults_to_the_model_folders_name(model_dir):
    assert served_model_name(parse("--model", model_dir)) == "Llama-3.1-8B"


def test_a_given_served_model_name_wins_over_the_folder_name():
    assert served_model_name(parse("--model", "/models/tiny", "--served-model-name", "llama")) == "llama"
