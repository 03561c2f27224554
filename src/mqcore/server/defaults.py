"""The defaults of `mqcore serve`'s bounds, in a module that imports nothing: the command
line shows them in its help without importing the server (which needs the server extra).
docs/server.md "Limits and bad input" explains each."""

DEFAULT_PORT = 9092
MAX_CONNECTIONS = 4096
MAX_CONNECTIONS_PER_IP = 1000  # Kafka's max.connections.per.ip (unbounded in Kafka)
MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
MAX_UNAUTHENTICATED_REQUEST_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size
MAX_QUEUED_REQUEST_BYTES = 512 * 1024 * 1024  # Kafka's queued.max.request.bytes
IDLE_TIMEOUT = 600.0  # seconds: Kafka's connections.max.idle.ms
REQUEST_TIMEOUT = 30.0  # seconds for a request, the TLS handshake, SASL authentication
IO_THREADS = 8  # Kafka's num.io.threads
MUTATION_RATE = 100.0  # partitions a second, per principal (KIP-599)
MUTATION_BURST = 1_100  # Kafka's burst: the rate times 11 one-second quota windows

# the consumer group protocol (KIP-848: server/consumergroups.py)
CONSUMER_SESSION_TIMEOUT = 45.0  # seconds: Kafka's group.consumer.session.timeout.ms
CONSUMER_HEARTBEAT_INTERVAL = 5.0  # seconds: group.consumer.heartbeat.interval.ms

# the HTTP listener (the JSON API and the console: server/httplimits.py)
HTTP_MAX_CONNECTIONS = 1024
HTTP_MAX_CONNECTIONS_PER_IP = 256
HTTP_REQUEST_TIMEOUT = REQUEST_TIMEOUT  # the Kafka listener's
HTTP_IDLE_TIMEOUT = 5.0  # uvicorn's keep-alive
