"""The MQTT 3.1.1 / 5.0 adapter: listener, connections, sessions, retained messages."""
