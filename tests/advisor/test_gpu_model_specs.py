"""A GPU model typed in a shape or goal (`8@A100`) means every model of that name, as the help
and the docs' examples write it; a model no GPU of the fleet is refuses the shape in one line."""

from __future__ import annotations

import pytest

from advisor.cli import main
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from advisor.model import model_matches, spec_allows, spec_models

A100 = "NVIDIA A100-SXM4-80GB"
NAMES = [A100, "NVIDIA A100-SXM4-40GB", "NVIDIA A10", "NVIDIA H100 80GB HBM3", "V100M16"]


@pytest.mark.parametrize(
    ("part", "matched"),
    [
        (A100, [A100]),  # its own name
        ("A100", [A100, "NVIDIA A100-SXM4-40GB"]),  # a word: every A100
        ("a100-sxm4-80gb", [A100]),  # words in order, case ignored
        ("A100 80GB", [A100]),  # words in order, not adjacent
        ("80GB A100", []),  # out of order
        ("A10", ["NVIDIA A10"]),  # a word, not a prefix of A100
        ("H100", ["NVIDIA H100 80GB HBM3"]),
        ("V100M16", ["V100M16"]),  # a trace's name matches only itself
        ("V100", []),
        ("-", []),  # no word at all
    ],
)
def test_a_typed_model_matches_the_names_holding_its_words(part, matched) -> None:
    assert spec_models(part, NAMES) == matched
    assert [n for n in NAMES if model_matches(part, n)] == matched


def test_a_spec_of_several_models_and_the_empty_spec() -> None:
    assert spec_models("A10|H100", NAMES) == ["NVIDIA A10", "NVIDIA H100 80GB HBM3"]
    assert spec_models("", NAMES) == NAMES  # any model
    assert spec_allows("", "anything") and not spec_allows("B200", A100)


def test_a_short_model_name_counts_the_jobs_its_full_name_counts() -> None:
    model = load_source("sim:a100-16x8?t=2d")
    full, short = measures.Shape(8, gpu_spec=A100), measures.parse_shape("8@A100")
    assert measures.jobs_that_fit(model, full) > 0
    assert measures.jobs_that_fit(model, short) == measures.jobs_that_fit(model, full)
    measures.check_models(model, short)
    with pytest.raises(ValueError, match=r"^8 GPU \[B200\]: no GPU model here matches 'B200' "):
        measures.check_models(model, measures.parse_shape("8@B200"))


def test_the_cli_reads_short_models_and_refuses_unknown_ones(capsys) -> None:
    assert main(["analyze", "sim:a100-16x8?t=2d", "--shape", "8@A100", "--json"]) == 0
    assert main(["analyze", "sim:a100-16x8?t=2d", "--shape", "8@A10"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gpu-defrag analyze: error: 8 GPU [A10]: no GPU model here matches 'A10' (models: {A100})\n"
    )
    assert main(["plan", "sim:a100-16x8?t=2d", "--goal", "job=8@B200"]) == 2
    assert "no GPU model here matches 'B200'" in capsys.readouterr().err
    # the goal on the short name is planned as on the full name: feasible on this fleet
    assert main(["plan", "sim:a100-16x8?t=2d", "--goal", "job=2x8@A100"]) == 0
