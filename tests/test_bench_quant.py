"""`python -m kvonce bench quant`'s argument parsing (CPU: the benchmark itself needs a GPU)."""
import pytest

from kvonce.bench import quant


def test_heads_parse_into_labelled_cases():
    assert quant.parse_heads("") == list(quant.HEADS)
    assert quant.parse_heads("12/2,8/8") == [(12, 2, "GQA 12/2"), (8, 8, "MHA 8/8")]


@pytest.mark.parametrize("bad", ["12", "12/5", "2/4", "x/2", "12/0"])
def test_heads_reject_what_is_not_a_group(bad):
    with pytest.raises(SystemExit, match="--heads"):
        quant.parse_heads(bad)


def test_shapes_parse_and_reject():
    assert quant.parse_shapes("8x8192,1x65536") == [(8, 8192), (1, 65536)]
    with pytest.raises(SystemExit, match="--shapes"):
        quant.parse_shapes("8x100")
