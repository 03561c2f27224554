"""What writes for a producer beyond a plain append: idempotent producers, transactions
(half messages committed through `__txn_half`), delayed messages (the timer log `__delay`) and
the trimming of those internal topics. A sibling of `mqcore.consume`: neither imports the
other; both stand on `mqcore.log` (docs/architecture.md)."""
