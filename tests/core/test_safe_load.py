"""oblr.safe_load: the one reader of user YAML and JSON (limits on aliases, expanded size and depth)."""

from __future__ import annotations

import pytest

from oblr.safe_load import InputError, InputLimitError, json_depth, load_json, load_yaml, load_yaml_file


def test_plain_yaml_reads_as_safe_load_does_and_aliases_are_independent_copies():
    data = load_yaml("a: &x {p: 1, q: [1, 2]}\nb: *x\nc:\n  <<: *x\n  r: 3\n", "t")
    assert data == {"a": {"p": 1, "q": [1, 2]}, "b": {"p": 1, "q": [1, 2]}, "c": {"p": 1, "q": [1, 2], "r": 3}}
    data["b"]["q"].append(9)
    assert data["a"]["q"] == [1, 2]  # an override of one place never changes another
    assert load_yaml("", "t") is None and load_yaml("1e-3", "t") == "1e-3"


def test_small_limits_show_each_rule():
    # expanded: the mapping (1), its 3 keys, a (1 + 3), b (1 + 3 * 4), c (1 + 3 * 13): 61 values, 4 levels
    nine = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"
    assert load_yaml(nine, "t", max_nodes=61)["c"][2][2] == ["x", "x", "x"]
    with pytest.raises(InputLimitError, match="t: expands to more than 60 values through its YAML aliases"):
        load_yaml(nine, "t", max_nodes=60)
    with pytest.raises(InputLimitError, match="t:3:.*more than 5 YAML aliases"):
        load_yaml(nine, "t", max_aliases=5)
    with pytest.raises(InputLimitError, match="nested deeper than 3 levels once its YAML aliases are expanded"):
        load_yaml(nine, "t", max_depth=3)
    with pytest.raises(InputLimitError, match=r"t:1:4: nested deeper than 3 levels"):
        load_yaml("[[[[[1]]]]]", "t", max_depth=3)
    with pytest.raises(InputLimitError, match="a YAML alias refers to a value that contains it"):
        load_yaml("a: &a {b: *a}", "t")


def test_invalid_yaml_and_json_are_one_line_with_the_place():
    with pytest.raises(InputError) as e:
        load_yaml("a: [1, 2\nb: 3\n", "c.yaml")
    assert str(e.value).startswith("c.yaml:") and "not valid YAML" in str(e.value) and "\n" not in str(e.value)
    assert not isinstance(e.value, InputLimitError)
    with pytest.raises(InputError, match=r"r: invalid JSON at line 1, column 2"):
        load_json("{bad", "r")
    with pytest.raises(InputError, match="r: JSON value refused: Exceeds the limit"):
        load_json("1" * 5000, "r")
    with pytest.raises(InputLimitError, match="r: JSON nested deeper than 50 levels"):
        load_json("[" * 200_000 + "]" * 200_000, "r")
    assert load_json("[" * 50 + "]" * 50, "r") is not None and json_depth({"a": [1, {"b": 2}]}) == 4


def test_yaml_file_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_yaml_file(tmp_path / "none.yaml", what="config file")
    (tmp_path / "x.yaml").write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(InputError, match=r"x\.yaml:2: not valid UTF-8 \(byte 0xe9\)"):
        load_yaml_file(tmp_path / "x.yaml")
