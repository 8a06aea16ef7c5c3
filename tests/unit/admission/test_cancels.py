"""A cancel request on dwell.publish (dwell.admission.cancels): what makes a record one,
and each way it can fail to fit."""

from __future__ import annotations

import re

import orjson
import pytest

from dwell.admission.cancels import (
    CHUNK_CHARS,
    _chunks,
    cancel_path,
    cancel_request,
    cancellations_path,
)
from dwell.admission.schema import PublishError
from dwell.core.topics import TopicName


def req(**fields: object) -> bytes:
    return orjson.dumps(fields)


def test_a_cancel_request_and_what_is_not_one() -> None:
    got = cancel_request(req(topic="persistent://t/ns/x", producerName="p",
                             cancel=["dwell.delayed:0:5"]), 10)
    assert got is not None
    assert (got.topic, got.producerName, got.cancel) == (
        "persistent://t/ns/x", "p", ["dwell.delayed:0:5"])
    # A publish, even with "cancel" in a property or a payload, is not.
    for value in (req(messages=[{"payload": "x"}]),
                  req(messages=[{"payload": "x", "properties": {"cancel": "y"}}]),
                  req(messages=[{"payload": '"cancel"'}]),
                  b'{"cancel": [1, 2', b"not json", req(cancel=None, messages=[])):
        assert cancel_request(value, 10) is None, value
    # No ids: a request that gets no results, as a publish without messages.
    empty = cancel_request(req(cancel=[]), 10)
    assert empty is not None and empty.cancel == []


@pytest.mark.parametrize(("value", "reason"), [
    (req(cancel=["a:0:1"], messages=[]), "either publishes (messages) or cancels"),
    (req(cancel="a:0:1"), "cancel: must be a list of messageIds"),
    (req(cancel=[1]), "cancel: must be a list of messageIds"),
    (req(cancel=["a:0:1"] * 11), "cancel: 11 messageIds; the limit per request is 10"),
    (req(cancel=["a:0:1"], topic=5), "topic: must be a string"),
    (req(cancel=["a:0:1"], producerName=[]), "producerName: must be a string"),
])
def test_a_cancel_request_that_does_not_fit(value: bytes, reason: str) -> None:
    with pytest.raises(PublishError, match=re.escape(reason)) as err:
        cancel_request(value, 10)
    assert err.value.status == 400


def test_the_tracker_path_quotes_what_the_caller_chose() -> None:
    name = TopicName.parse("persistent://te/ns/a#b")
    assert cancel_path(name, "dwell.delayed:0:5") == (
        "/v1/topics/persistent/te/ns/a%23b/messages/dwell.delayed:0:5")
    assert cancel_path(name, "../../x?y") == (
        "/v1/topics/persistent/te/ns/a%23b/messages/..%2F..%2Fx%3Fy")
    assert cancellations_path(name) == "/v1/topics/persistent/te/ns/a%23b/cancellations"


def test_ids_go_to_the_tracker_in_chunks_that_fit_its_body_limit() -> None:
    ids = [f"dwell.delayed:0:{i}" for i in range(1000)]
    assert _chunks(ids) == [ids]
    assert _chunks([]) == []
    # Long ids (the longest an id can be, and ones past it, counted at that length).
    long_ids = ["t" * 249 + f":0:{i}" for i in range(1000)] + ["x" * 10**6]
    chunks = _chunks(long_ids)
    assert [i for c in chunks for i in c] == long_ids
    assert all(sum(min(len(i), 300) + 4 for i in c) <= CHUNK_CHARS for c in chunks)
    assert len(chunks) == 6
