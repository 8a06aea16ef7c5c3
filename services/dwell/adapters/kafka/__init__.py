"""The one place that talks to Kafka, over confluent-kafka (librdkafka): producers,
the consumer, admin helpers and offset scans. Everything else in dwell sees `Record`,
futures and plain dicts, and imports them from here."""

from confluent_kafka import OFFSET_BEGINNING, Message

from .admin import (
    DWELL_TOPIC_DEFAULTS,
    KEEP_UNTIL_DELIVERED,
    KEPT_TOPICS,
    admin,
    delete_below,
    delete_topic,
    end_offsets,
    ensure_dwell_topics,
    ensure_retention,
    ensure_topic,
    offsets_at,
    partition_count,
    partition_counts,
    partitions,
    ping,
    retention_refusal,
    retention_risks,
    start_group_at_end,
    topic_names,
)
from .consumer import Columns, Consumer, next_offsets
from .errors import KafkaUnavailable, RetentionRefused, TopicRefused
from .producer import BulkProducer, Producer, TransactionalProducer
from .record import Headers, OutRecord, Record
from .scan import SCAN_CONFIG, iter_from, read_all, read_from, read_offsets, read_spans

__all__ = [
    "DWELL_TOPIC_DEFAULTS",
    "KEEP_UNTIL_DELIVERED",
    "KEPT_TOPICS",
    "OFFSET_BEGINNING",
    "SCAN_CONFIG",
    "BulkProducer",
    "Columns",
    "Consumer",
    "Headers",
    "KafkaUnavailable",
    "Message",
    "OutRecord",
    "Producer",
    "Record",
    "RetentionRefused",
    "TopicRefused",
    "TransactionalProducer",
    "admin",
    "delete_below",
    "delete_topic",
    "end_offsets",
    "ensure_dwell_topics",
    "ensure_retention",
    "ensure_topic",
    "next_offsets",
    "offsets_at",
    "partition_count",
    "partition_counts",
    "partitions",
    "ping",
    "iter_from",
    "read_all",
    "read_from",
    "read_offsets",
    "read_spans",
    "retention_refusal",
    "retention_risks",
    "start_group_at_end",
    "topic_names",
]
