"""Tests as an attacker: forged records on every Kafka topic dwell reads, oversized and
malformed input on every path, another tenant's names, numbers at their limits."""
