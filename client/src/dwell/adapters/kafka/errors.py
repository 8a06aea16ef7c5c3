"""The errors every part of the Kafka adapter raises."""

from __future__ import annotations


class KafkaUnavailable(Exception):
    """Kafka could not be reached or did not acknowledge in time (retriable). The SDK's
    ``Consumer`` raises it when Kafka is out of reach while it is set up."""


class TopicRefused(Exception):
    """Kafka refuses to create a topic of this name, for good: typically it collides with
    an existing topic (Kafka treats '.' and '_' in topic names alike)."""


class RetentionRefused(Exception):
    """A topic dwell keeps pending messages in (or what a rebuild needs) could drop records
    by age or size, and Kafka refuses to change that (no ALTER_CONFIGS right, a broker
    policy): a process that started anyway would lose messages silently."""
