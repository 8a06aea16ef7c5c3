"""dwell: Apache Pulsar's delayed-delivery model for Kafka users."""
