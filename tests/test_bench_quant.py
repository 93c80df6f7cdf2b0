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


def test_power_state_runs_the_call_before_timing_it(monkeypatch):
    """``--sustain``: the call runs back to back until that many seconds have passed, then the
    timer gets it; without it the timer gets the call untouched (no call before). A fake clock
    (0.01 s a reading) makes the count exact."""
    import itertools

    clock = itertools.count()
    monkeypatch.setattr(quant.time, "perf_counter", lambda: next(clock) * 0.01)
    calls, timed_at = [], []

    def timer(f):
        timed_at.append(len(calls))
        return 1.5

    assert quant.in_power_state(timer, sustain_s=0.05)(lambda: calls.append(1)) == 1.5
    assert timed_at == [4] and len(calls) == 4     # readings 0.01 .. 0.04 pass, 0.05 ends it
    calls.clear()
    timed_at.clear()
    assert quant.in_power_state(timer)(lambda: calls.append(1)) == 1.5
    assert calls == [] and timed_at == [0]
