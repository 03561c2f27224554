"""The consumption model on top of the log: consumer groups and committed offsets, retry and
dead-letter, and message trace. Producers, transactions and delays are its sibling
`mqcore.produce`. Every piece keeps its state in internal topics of the same store (names
starting with `__`), so it recovers with the log's own machinery (docs/consume.md).
"""
