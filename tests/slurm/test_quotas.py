"""Slurm's QOS and association GPU limits as the planner's quotas (advisor.ingest.slurm.quotas),
and the borrowing seed case planned with quotas that come from Slurm instead of the file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from advisor import snapshot
from advisor.ingest.slurm.quotas import quotas_from_json, quotas_from_text
from advisor.ingest.slurm.values import SlurmFormatError
from advisor.planner.borrow import plan_borrow, request_for_job
from advisor.planner.constraints import load_policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# sacctmgr --parsable2 --noheader show qos format=Name,GrpTRES
QOS = "normal|\nhigh|gres/gpu=64\nlow|cpu=128,gres/gpu:a100=8\n"
# ... show associations format=Cluster,Account,User,Partition,GrpTRES where cluster=gdtest
ASSOCIATIONS = """\
gdtest|root|||
gdtest|root|root||
gdtest|rnd|||gres/gpu=40
gdtest|rnd|ada||gres/gpu=16
gdtest|rnd|bob||gres/gpu=8
gdtest|algorithms|||cpu=512,gres/gpu=30
gdtest|algorithms|ada|debug|gres/gpu=2
gdtest|product|||gres/gpu=20,gres/gpu:a100=12
gdtest|ops|||cpu=64
"""


def test_account_quotas_from_associations():
    found = quotas_from_text(QOS, ASSOCIATIONS, "account")
    assert found.policy.quotas == {
        ("rnd", ""): 40,
        ("algorithms", ""): 30,
        ("product", ""): 20,
        ("product", "a100"): 12,
    }
    assert found.origin[("rnd", "")] == "account rnd GrpTRES"
    assert found.notes == ()


def test_user_and_qos_quotas():
    users = quotas_from_text(QOS, ASSOCIATIONS, "user").policy.quotas
    assert users == {("ada", ""): 18, ("bob", ""): 8}  # ada: rnd 16 + algorithms/debug 2
    assert quotas_from_text(QOS, ASSOCIATIONS, "qos").policy.quotas == {
        ("high", ""): 64,
        ("low", "a100"): 8,
    }


def test_no_gpu_limit_is_a_note_and_a_bad_line_an_error():
    found = quotas_from_text("normal|\n", "gdtest|root|||\n", "account")
    assert found.policy.quotas == {} and found.notes == ("no GPU limit (GrpTRES gres/gpu)",)
    with pytest.raises(SlurmFormatError, match="line 1 has 3 fields, expected 2"):
        quotas_from_text("normal|x|y\n", "", "account")


def test_quotas_from_slurmdb_json():
    tres = [{"type": "gres", "name": "gpu", "id": 1001, "count": 40}]
    typed = [
        {"type": "cpu", "name": "", "id": 1, "count": 64},
        {"type": "gres", "name": "gpu:a100", "count": 8},
    ]
    qos_doc = {
        "qos": [{"name": "high", "limits": {"max": {"tres": {"total": tres}}}}],
        "errors": [],
    }
    assoc_doc = {
        "associations": [
            {"account": "rnd", "user": "", "partition": "", "max": {"tres": {"total": tres}}},
            {"account": "rnd", "user": "ada", "partition": None, "max": {"tres": {"total": typed}}},
        ],
        "errors": [],
    }
    assert quotas_from_json(qos_doc, assoc_doc, "account").policy.quotas == {("rnd", ""): 40}
    assert quotas_from_json(qos_doc, assoc_doc, "user").policy.quotas == {("ada", "a100"): 8}
    assert quotas_from_json(qos_doc, assoc_doc, "qos").policy.quotas == {("high", ""): 40}


def test_borrow_seed_with_quotas_from_slurm_gives_the_files_plan():
    """The seed's quotas set as account GrpTRES in Slurm: the same loans as policy-borrow.yaml."""
    model = snapshot.load(EXAMPLES / "seed-quota-borrow.json")
    from_file = load_policy(EXAMPLES / "policy-borrow.yaml")
    accounts = "c|rnd|||gres/gpu=40\nc|algorithms|||gres/gpu=30\nc|product|||gres/gpu=20\n"
    from_slurm = quotas_from_text("normal|\n", accounts, "account").policy
    assert from_slurm.quotas == from_file.quotas
    merged = replace(from_file, quotas=from_slurm.quotas)  # the file's borrowing rules
    request = request_for_job(model, "rnd-pretrain")
    a, b = plan_borrow(model, from_file, request), plan_borrow(model, merged, request)
    assert a.feasible and [x.to_dict() for x in a.actions] == [x.to_dict() for x in b.actions]
