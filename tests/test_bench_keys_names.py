"""keys.read's named numbers of a source file: a Python tuple assignment names each of its constants."""

from specgen.bench import keys


def test_a_tuple_assignment_gives_each_name_its_value(tmp_path):
    src = tmp_path / "tuning.py"
    src.write_text("PROBE_EVERY, MAX_PROBE_EVERY = 16, 256  # steps\nBIN_WEIGHT, BIN_DECAY = 3.0, 0.97\n"
                   "A, B = 1, 2, 3\nSINGLE = 7\nLEVEL = 0.90\nTWICE, OTHER = 1, 2\nTWICE = 5\n")
    names = keys.read(src)["names"]
    assert (names["PROBE_EVERY"], names["MAX_PROBE_EVERY"]) == (16, 256)
    assert (names["BIN_WEIGHT"], names["BIN_DECAY"]) == (3.0, 0.97)
    assert names["SINGLE"] == 7 and names["LEVEL"] == 0.90
    assert "A" not in names and "B" not in names  # names and values that do not pair up name nothing
    assert "TWICE" not in names and names["OTHER"] == 2  # a name given two values is left out
