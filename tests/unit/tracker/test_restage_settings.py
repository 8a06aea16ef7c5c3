"""The tracker's settings rules (restage, group ids) and its chunk arithmetic (no servers)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dwell.admission.settings import AdmissionSettings
from dwell.policy.settings import PolicySettings
from dwell.tracker.restage import Restager
from dwell.tracker.settings import TrackerSettings


def test_defaults_re_file_a_20s_chunk_40s_ahead_with_a_lease_shorter_than_the_lead() -> None:
    s = TrackerSettings()
    assert (s.restage_lead_ms, s.restage_chunk_ms, s.restage_lease_ms) == (40_000, 20_000, 30_000)
    assert s.refile_log == "dwell.delayed.refiled"


def test_another_delayed_topic_gets_its_own_refile_log() -> None:
    assert TrackerSettings(delayed_topic="t.delayed").refile_log == "t.delayed.refiled"
    assert TrackerSettings(delayed_topic="t.delayed", refiled_topic="x").refile_log == "x"


@pytest.mark.parametrize(("env", "message"), [
    ({"restage_lead_ms": 10_000, "restage_chunk_ms": 20_000, "restage_lease_ms": 5_000},
     "DWELL_RESTAGE_CHUNK_MS must not exceed DWELL_RESTAGE_LEAD_MS"),
    ({"restage_lease_ms": 40_000},
     "DWELL_RESTAGE_LEASE_MS must be less than DWELL_RESTAGE_LEAD_MS"),
])
def test_settings_that_would_delay_a_chunk_are_refused(env: dict[str, int], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrackerSettings(**env)


def test_the_due_chunk_is_the_one_whose_first_bucket_is_within_the_lead() -> None:
    r = Restager(None, "127.0.0.1:1", lead_ms=40_000, chunk_ms=20_000)  # type: ignore[arg-type]
    assert r.chunk_due(0) == 2  # [40 s, 60 s)
    assert r.chunk_due(19_999) == 2
    assert r.chunk_due(20_000) == 3
    with pytest.raises(ValueError, match="chunk_ms <= lead_ms"):
        Restager(None, "127.0.0.1:1", lead_ms=1000, chunk_ms=2000)  # type: ignore[arg-type]


@pytest.mark.parametrize("group", ["trk-a", "tracker", "dwell-", "acme"])
def test_a_group_id_a_tenant_could_name_stops_the_process(group: str) -> None:
    with pytest.raises(ValidationError, match="DWELL_TRACKER_GROUP_ID must start with 'dwell-'"):
        TrackerSettings(tracker_group_id=group)
    with pytest.raises(ValidationError, match="DWELL_INGRESS_GROUP must start with 'dwell-'"):
        AdmissionSettings(ingress_group=group)
    with pytest.raises(ValidationError,
                       match="DWELL_POLICY_AUDIT_GROUP must start with 'dwell-'"):
        PolicySettings(policy_audit_group=group)


def test_dwell_group_ids_are_taken() -> None:
    assert TrackerSettings(tracker_group_id="dwell-tracker-2").tracker_group_id == "dwell-tracker-2"
    assert AdmissionSettings(ingress_group="dwell-admission-b").ingress_group == "dwell-admission-b"
    assert PolicySettings().policy_audit_group == "dwell-policy-audit"
