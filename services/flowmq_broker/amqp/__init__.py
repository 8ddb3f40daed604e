"""The AMQP 0-9-1 adapter: listener, connections, channels, exchanges, queue bindings."""
