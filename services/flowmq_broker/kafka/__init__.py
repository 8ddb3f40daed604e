"""The Kafka protocol adapter: Kafka clients produce to and consume from Streams
(DESIGN.md §3, §5, §6).  ``server.KafkaServer`` is what the broker starts for role kafka."""
