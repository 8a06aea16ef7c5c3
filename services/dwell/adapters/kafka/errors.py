"""The errors every part of the Kafka adapter raises."""

from __future__ import annotations


class KafkaUnavailable(Exception):
    """Kafka could not be reached or did not acknowledge in time (retriable)."""


class TopicRefused(Exception):
    """Kafka refuses to create a topic of this name, for good: typically it collides with
    an existing topic (Kafka treats '.' and '_' in topic names alike)."""
