"""`slurm:` specs and the one-line errors every command prints for them (no Slurm needed)."""

from __future__ import annotations

import pytest

from advisor.ingest.slurm.spec import parse_spec
from advisor.ingest.sources import SourceError, load_source
from tests.ports import free_port


def test_spec_forms_and_options():
    local = parse_spec("slurm:?partition=a100,h100&tenant=user&max-priority=500&conf=/etc/x.conf")
    assert local.rest == "" and local.conf == "/etc/x.conf"
    assert local.options.partitions == ("a100", "h100")
    assert local.options.tenant == "user" and local.options.max_priority == 500
    rest = parse_spec("slurm+https://ctl.example:6820/?user=ada&api=v0.0.40&topology=/t.conf")
    assert rest.rest == "https://ctl.example:6820" and rest.api == "v0.0.40"
    assert rest.user == "ada" and rest.topology_file == "/t.conf"
    unix = parse_spec("slurm+unix:///run/slurmrestd.sock?tenant=qos")
    assert unix.rest == "unix:///run/slurmrestd.sock" and unix.options.tenant == "qos"
    assert parse_spec("slurm:").options.max_priority is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("slurm:?colour=red", "slurm:?colour=red: option 'colour' is unknown (known: conf, "),
        ("slurm:?token-file=/x", "option 'token-file' is not read by this form"),
        ("slurm+http://h:6820?conf=/x", "option 'conf' is not read by this form"),
        ("slurm:?tenant=team", "tenant='team': expected one of account, user, qos"),
        ("slurm:?max-priority=high", "max-priority='high': expected a whole number"),
        ("slurm:cluster1", "slurm: takes no name after the colon"),
        ("slurm+http://?user=x", "expected slurm+http://HOST:PORT"),
        ("slurm+http://h:1?api=3", "api='3': expected an OpenAPI version such as v0.0.38"),
    ],
)
def test_bad_specs_are_one_line(spec, message):
    with pytest.raises(SourceError) as error:
        load_source(spec)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_no_slurm_commands_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without scontrol
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SourceError) as error:
        load_source("slurm:")
    assert str(error.value) == (
        "slurm: scontrol is not installed or not on PATH (Debian: apt-get install slurm-client); "
        "the slurm: source reads the cluster with scontrol, squeue and sinfo"
    )


def test_slurmrestd_unreachable(tmp_path):
    port = free_port()  # nobody listens there
    with pytest.raises(SourceError) as error:
        load_source(f"slurm+http://127.0.0.1:{port}")
    assert str(error.value) == (
        f"slurm+http://127.0.0.1:{port}: slurmrestd http://127.0.0.1:{port} is unreachable: "
        "Connection refused"
    )
    with pytest.raises(SourceError) as error:
        load_source(f"slurm+unix://{tmp_path}/none.sock")
    assert "is unreachable: No such file or directory" in str(error.value)


def test_a_missing_token_file_is_named(tmp_path):
    with pytest.raises(SourceError) as error:
        load_source(f"slurm+http://127.0.0.1:9?token-file={tmp_path}/jwt")
    assert f"token-file={tmp_path}/jwt: cannot read: No such file or directory" in str(error.value)


def test_the_service_takes_a_slurm_source_whose_controller_is_down_now(tmp_path):
    """`gpu-defrag advise --source slurm:...` checks the spec's form at start and reads at
    every run: a controller that is down now may answer later."""
    from advisor.ingest.live import make_ingest

    ingest = make_ingest(f"slurm:?conf={tmp_path}/slurm.conf", timeout_s=5)
    with pytest.raises(SourceError, match=r"no slurm\.conf there"):
        ingest()
    with pytest.raises(SourceError, match="option 'colour' is unknown"):
        make_ingest("slurm:?colour=red", timeout_s=5)


def test_the_app_refreshes_slurm_sources():
    from advisor.app.data import is_live

    assert is_live("slurm:") and is_live("slurm+http://ctl:6820")
