import pytest

from durations import format_duration, parse_duration


@pytest.mark.parametrize("text,seconds", [
    ("90s", 90.0), ("1h30m", 5400.0), ("2d 4h", 187200.0), ("1.5h", 5400.0), ("250ms", 0.25),
    ("1H", 3600.0), (" 10m ", 600.0),
])
def test_parse(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "h", "5x", "1h2h"])
def test_parse_invalid(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format():
    assert format_duration(93784) == "1d2h3m4s"
    assert format_duration(0) == "0s"
