"""dwell's SDK: Producer and its asyncio twin AsyncProducer (deliver_at / deliver_after) and
Consumer (ack, nack, ack timeout, redelivery backoff), in Pulsar's shape."""

from dwell.adapters.kafka import KafkaUnavailable
from dwell.core.backoff import ExponentialRedeliveryBackoff

from .consumer import Consumer, Message, SubscribeError
from .producer import (
    AsyncProducer,
    CancelResult,
    NotAllowedError,
    Producer,
    ProducerQueueIsFullError,
    PublishError,
)

__all__ = ["AsyncProducer", "CancelResult", "Consumer", "ExponentialRedeliveryBackoff",
           "KafkaUnavailable", "Message", "NotAllowedError", "Producer",
           "ProducerQueueIsFullError", "PublishError", "SubscribeError"]
