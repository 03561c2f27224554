"""Child process of tests/test_server_produce.py: `mqcore serve` with flush="always" under a
sync ledger (tests/powerloss.py), until it is killed.

    python powerloss_server.py <store> <ledger>

Prints the address clients bootstrap from on its first line, then serves.
"""

from __future__ import annotations

import os
import sys
import threading

import powerloss


def main(path: str, ledger: str) -> None:
    powerloss.install(path, ledger)  # before mqcore is imported: it sees every sync
    from mqcore.server import Server

    server = Server(path, listen="127.0.0.1:0", flush="always").start()
    os.write(1, (server.bootstrap + "\n").encode())
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
