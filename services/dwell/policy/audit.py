"""The feed audit: every `dwell.policies` record that a reader cannot take is set aside on
`dwell.invalid`, once for the whole deployment rather than once per reader, rebuild and
restart.

Kafka is a trust boundary, so the feed may hold a record of any shape. The followers
(admission's and the tracker's `PolicyCache`) skip such a record and count it
(`dwell_policy_records_skipped_total`); a store rebuild leaves it out of Redis
(policy.rebuild). This audit, run by the policy service, reads the feed under one
committed consumer group (`DWELL_POLICY_AUDIT_GROUP`), judges each record with both
readers' own code (a scratch `PolicyCache`, and `store.unreadable`), writes the ones
refused to `dwell.invalid` with the reason, and commits only after Kafka has them: a
crash between the two sets a record aside again, never not at all. Replicas of the
policy service share the group, so each record is audited by one of them."""

from __future__ import annotations

import logging
import threading

from dwell.adapters import kafka
from dwell.core import invalid, topics
from dwell.core.policy import BrokerDefaults
from dwell.policy.feed import record_version
from dwell.policy.store import scope_key, unreadable
from dwell.policy_view import PolicyCache, scope_of

log = logging.getLogger("dwell.policy.audit")


class FeedAudit:
    def __init__(self, bootstrap: str, group: str, broker: BrokerDefaults,
                 max_record_bytes: int) -> None:
        self._bootstrap = bootstrap
        self._group = group
        self._max_record_bytes = max_record_bytes
        self._cache = PolicyCache(broker)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="policy-feed-audit",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._audit()
            except kafka.KafkaUnavailable as exc:
                log.warning("feed audit: %s; retrying", exc)
                self._stop.wait(1.0)
            except Exception:
                # No record may end the audit: it goes on from the committed offsets.
                log.exception("feed audit failed; retrying")
                self._stop.wait(1.0)

    def _audit(self) -> None:
        consumer = kafka.Consumer(self._bootstrap, self._group, [topics.POLICIES])
        producer = kafka.Producer(self._bootstrap)
        try:
            while not self._stop.is_set():
                records = consumer.poll(500, 1.0)
                if not records:
                    continue
                refused = 0
                for r in records:
                    refusal = self._judge(r)
                    if refusal is not None:
                        kind, reason = refusal
                        log.warning("%s record %r at %d:%d set aside on %s: %s",
                                    topics.POLICIES, (r.key or b"")[:200], r.partition,
                                    r.offset, topics.INVALID, reason)
                        # A value near the broker's limit would not fit with the
                        # headers: its size says enough.
                        value = r.value
                        if value is not None and len(value) > self._max_record_bytes:
                            reason += f" (value of {len(value)} bytes not copied)"
                            value = None
                        out = invalid.invalid_record(r.topic, r.partition, r.offset, r.key,
                                                     value, kind, reason)
                        producer.send(out[0], out[1], key=out[2], headers=dict(out[3]))
                        refused += 1
                if refused:
                    producer.flush()
                consumer.commit(kafka.next_offsets(records))
        finally:
            producer.close()
            consumer.close()

    def _judge(self, r: kafka.Record) -> tuple[str, str] | None:
        """(the dwell.invalid kind, the reason) when a reader cannot take `r`."""
        if r.key is not None:
            try:
                scope = r.key.decode()
            except UnicodeDecodeError:
                return invalid.FIELD, "the key is not UTF-8"
        refusal = self._cache.apply(scope_of(r.key), r.value, r.headers)
        if refusal is not None:
            return refusal
        version = record_version(r)
        if r.key is None or version is None:
            return None  # not a policy store record: the store takes none of it
        try:
            scope_key(scope)
        except ValueError:
            return None
        reason = unreadable(scope, version, r.value, self._max_record_bytes)
        return (invalid.FIELD, reason) if reason is not None else None
