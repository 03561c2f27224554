"""The consumption model on top of the log: consumer groups and committed offsets, retry and
dead-letter, transactional (half) messages, delayed messages, idempotent producers and message
trace. Every piece keeps its state in internal topics of the same store (names starting with
`__`), so it recovers with the log's own machinery (docs/consume.md).
"""
