"""Hand-written config files with a key given twice: the web config (basic_auth_users twice
dropped the first users silently), the policy (quotas twice) in YAML and JSON, and the alert
config are refused in one line naming the key, where the readers used to keep the last."""

from __future__ import annotations

import pytest
import yaml

from advisor.planner.constraints import PolicyError, load_policy
from gpu_defrag_common.config_text import load_json, load_yaml
from gpu_defrag_common.webconfig import WebConfigError, load_web_config


def test_a_key_given_twice_is_refused_with_both_lines() -> None:
    with pytest.raises(yaml.YAMLError, match=r"key 'a' given twice \(first on line 1\)"):
        load_yaml("a: 1\nb: 2\na: 3\n")
    with pytest.raises(yaml.YAMLError, match="key 'x' given twice"):
        load_yaml("top:\n  x: 1\n  x: 1\n")  # nested mappings too, even with equal values
    with pytest.raises(ValueError, match="key 'a' given twice"):
        load_json('{"a": {"b": 1}, "a": 2}')


def test_what_safe_load_reads_is_read_the_same() -> None:
    text = "base: &b {x: 1, y: 2}\nmerged:\n  <<: *b\n  y: 3\nlist: [1, {k: v}]\n"
    assert load_yaml(text) == yaml.safe_load(text)  # merge keys are not a repeated key
    assert load_yaml("") is None and load_json('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object:os.system {}")  # still a safe loader


def test_the_web_config_refuses_a_second_basic_auth_users(tmp_path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  alice: x\nbasic_auth_users:\n  bob: y\n")
    with pytest.raises(WebConfigError) as error:
        load_web_config(path)
    assert str(error.value) == (
        f"web config {path}: not valid YAML: line 3, column 1: key 'basic_auth_users' given "
        "twice (first on line 1)"
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("p.yaml", "quotas:\n  a: 8\nquotas:\n  b: 4\n"),
        ("p.json", '{"quotas": {"a": 8}, "quotas": {"b": 4}}'),
    ],
)
def test_a_policy_with_quotas_twice_is_refused(tmp_path, name, text) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PolicyError, match="key 'quotas' given twice"):
        load_policy(path)


def test_the_shipped_alert_config_has_no_repeated_key() -> None:
    from alerts.config import load_config

    assert load_config()["thresholds"]
