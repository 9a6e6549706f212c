"""The runbook pages the advisor serves: every alert's runbook_url, as the rules carry it, opens
a page of a running advisor that names the alert; the markdown is escaped, not trusted."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests

from advisor.cli import build_parser
from advisor.service import runbooks
from alerts.config import load_config
from alerts.generate import render_alerts
from tests.service.conftest import advisor_process


@pytest.fixture(scope="module")
def advisor():
    """An advisor on a small sim that reads no past: the runbook needs no run."""
    with advisor_process("--source", "sim:a100-16x8", "--history.backfill", "0") as running:
        yield running[0]


def shipped_alerts(base: str) -> dict[str, str]:
    rules = render_alerts(load_config({"advisor_external_url": base}))
    return {
        r["alert"]: r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"]
    }


def test_every_alerts_runbook_url_opens_its_page_on_the_running_advisor(advisor):
    urls = shipped_alerts(advisor)
    assert len(urls) >= 20
    with requests.Session() as session:
        for name, url in urls.items():
            response = session.get(url, timeout=10)
            assert response.status_code == 200, url
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
            assert f"<h1>{name}</h1>" in response.text, url
            assert f"<title>{name} - gpu-defrag runbook</title>" in response.text


def test_the_index_links_every_alert_and_names_the_external_url(advisor):
    response = requests.get(f"{advisor}/runbooks/", timeout=10)
    assert response.status_code == 200
    for name in shipped_alerts(advisor):
        assert f'<a href="{name}">{name}</a>' in response.text
    port = urlsplit(advisor).port
    assert f"http://localhost:{port}/runbooks/" in response.text  # the default external URL
    moved = requests.get(f"{advisor}/runbooks", timeout=10, allow_redirects=False)
    assert moved.status_code == 308 and moved.headers["Location"] == "runbooks/"
    assert requests.get(f"{advisor}/runbooks", timeout=10).url == f"{advisor}/runbooks/"


def test_an_unknown_alert_is_not_found(advisor):
    assert requests.get(f"{advisor}/runbooks/GpuNoSuchAlert", timeout=10).status_code == 404


def test_markdown_is_rendered_and_html_in_it_escaped():
    text = (
        "# title\nintro\n\n## GpuA\n- **Do:** run `a < b`\n<script>alert(1)</script>\n\n"
        "## GpuB\nsecond\n"
    )
    assert list(runbooks.sections(text)) == ["GpuA", "GpuB"]
    page = runbooks.page(text, "GpuA")
    assert "<strong>Do:</strong>" in page and "<code>a &lt; b</code>" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "second" not in page and "intro" not in page
    assert runbooks.page(text, "GpuC") is None
    assert runbooks.sections("no alert here") == {}


@pytest.mark.parametrize("url", ["ftp://host/", "localhost:9836", "http://host/?a=1"])
def test_a_bad_external_url_is_refused_in_one_line(url, capsys):
    args = ["advise", "--source", "sim:a100-16x8", "--web.external-url", url]
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(args)
    assert exited.value.code == 2
    assert "is not an http:// or https:// URL with a host" in capsys.readouterr().err
