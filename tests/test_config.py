import pytest

from specgen.app.config import DEFAULT_CONFIG, build_config, read_yaml
from specgen.errors import ConfigError


def test_defaults_come_from_default_yaml():
    cfg = build_config(None, {})
    defaults = read_yaml(DEFAULT_CONFIG)
    assert cfg.target == defaults["target"] == "gemma-3-270m-f32"
    assert cfg.draft == defaults["draft"] == "gemma-3-270m-q2_k"
    assert cfg.method == "auto" and cfg.max_tokens == 256 and cfg.temperature == 0.0


def test_command_line_over_yaml_over_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("max_tokens: 7\ntemperature: 0.5\n")
    cfg = build_config(f, {"max_tokens": 9, "temperature": None})
    assert cfg.max_tokens == 9 and cfg.temperature == 0.5


def test_own_target_drops_default_draft_but_not_an_explicit_one(tmp_path):
    assert build_config(None, {"target": "x.gguf"}).draft is None
    assert build_config(None, {"target": "x.gguf", "draft": "y.gguf"}).draft == "y.gguf"
    f = tmp_path / "c.yaml"
    f.write_text("draft: z.gguf\n")
    assert build_config(f, {"target": "x.gguf"}).draft == "z.gguf"
    assert build_config(None, {"draft": "none"}).draft is None


@pytest.mark.parametrize("text,message", [
    ("max_tokenz: 5\n", "unknown key 'max_tokenz'"),
    ("max_tokens: many\n", "max_tokens must be an integer, found 'many'"),
    ("max_tokens: true\n", "max_tokens must be an integer, found True"),
    ("- a\n- b\n", "expected a mapping of settings, found list"),
    ("target: [unclosed\n", "invalid YAML"),
])
def test_yaml_errors_name_the_problem(tmp_path, text, message):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        build_config(f, {})


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        build_config(tmp_path / "nope.yaml", {})


@pytest.mark.parametrize("override,message", [
    ({"max_tokens": -1}, "--max-tokens must be at least 1, found -1"),
    ({"temperature": -0.1}, "--temperature must be >= 0"),
    ({"top_p": 0.0}, r"--top-p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"--top-p must be in \(0, 1\]"),
    ({"threads": 0}, "--threads must be at least 1"),
    ({"method": "magic"}, "--method must be one of auto, plain"),
])
def test_out_of_range_options(override, message):
    with pytest.raises(ConfigError, match=message):
        build_config(None, override)
