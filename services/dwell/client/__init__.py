"""dwell's SDK: Producer (deliver_at / deliver_after) and Consumer (ack, nack, ack timeout,
redelivery backoff), in Pulsar's shape."""

from dwell.core.backoff import ExponentialRedeliveryBackoff

from .consumer import Consumer, Message, SubscribeError
from .producer import NotAllowedError, Producer, PublishError

__all__ = ["Consumer", "ExponentialRedeliveryBackoff", "Message", "NotAllowedError",
           "Producer", "PublishError", "SubscribeError"]
