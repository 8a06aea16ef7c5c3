"""Every Kafka header name dwell writes or reads, spelled here and nowhere else
(docs/architecture.md "Kafka topics"). Python imports the names; the Spark SQL in
`dwell_spark.drain` builds its expressions from them; tests/unit/test_headers.py finds
a second spelling.

Header values are ASCII decimal integers, except the names, ids and keys noted."""

from __future__ import annotations

from typing import Final

# -- on every message a dwell topic carries
TOPIC: Final = "dwell-topic"  # the Pulsar topic, persistent://t/ns/x
PUBLISH_TIME: Final = "dwell-publish-time"  # ms since the epoch: when admission received it
PRODUCER: Final = "dwell-producer"  # the request's producerName (may be empty)
SEQUENCE_ID: Final = "dwell-sequence-id"  # the message's sequenceId, when it has one
EVENT_TIME: Final = "dwell-event-time"  # the message's eventTime (ms), when it has one

# -- on dwell.delayed and dwell.delayed.refiled
DELIVER_AT: Final = "dwell-deliver-at"  # ms since the epoch; kept on the ready copy
TICK_TIME: Final = "dwell-tick-time"  # the topic's tickTime (ms) when admission took it
KEY: Final = "dwell-key"  # the message's own key (the record key is the Pulsar topic)
# The Kafka partition of the ready topic the drain writes the message to, when it was
# published to a partition `x-partition-N` of a partitioned topic (absent: any partition).
PARTITION: Final = "dwell-partition"
# The message's schedule key, UTF-8 text: a newer message of the topic with the same key
# replaces it while it is pending. On a record without dwell-deliver-at it is a release:
# the key's pending message is cancelled, and nothing is indexed (an immediate publish
# with a key; docs/internals.md "Replacing a message by its schedule key").
SCHEDULE_KEY: Final = "dwell-schedule-key"
MAX_SCHEDULE_KEY_BYTES: Final = 256  # admission refuses longer keys; the tracker ignores them

# -- on re-filed, drained and redelivered copies
ORIGIN: Final = "dwell-origin"  # <partition>:<offset>: the position in the delay log
MESSAGE_ID: Final = "dwell-message-id"  # <kafkaTopic>:<partition>:<offset>, the SDK's id
REDELIVERY_COUNT: Final = "dwell-redelivery-count"  # on retry-topic and DLQ copies
SUBSCRIPTION: Final = "dwell-subscription"  # on retry-topic and DLQ copies

# -- on dwell.policies
VERSION: Final = "dwell-version"  # the policy store's version of the change

# -- on dwell.publish requests and dwell.acks events: the client's credentials, UTF-8 text
# `Bearer <token>` as in HTTP's Authorization header (at most one).
AUTHORIZATION: Final = "dwell-authorization"

# -- on dwell.invalid: where the malformed record was read, and why it was refused
SOURCE_TOPIC: Final = "dwell-source-topic"  # dwell.publish or dwell.acks
SOURCE_PARTITION: Final = "dwell-source-partition"
SOURCE_OFFSET: Final = "dwell-source-offset"
INVALID_KIND: Final = "dwell-invalid-kind"  # one of dwell.core.invalid.KINDS
INVALID_REASON: Final = "dwell-invalid-reason"  # UTF-8 text naming the field or limit

ALL: Final = (TOPIC, PUBLISH_TIME, PRODUCER, SEQUENCE_ID, EVENT_TIME, DELIVER_AT, TICK_TIME,
              KEY, PARTITION, ORIGIN, MESSAGE_ID, REDELIVERY_COUNT, SUBSCRIPTION, VERSION,
              AUTHORIZATION, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, INVALID_KIND,
              INVALID_REASON)
