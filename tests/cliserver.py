"""`python -m mqcore.cli` for the tests (conftest.run_cli), started once instead of once a run.

A server process, started with the environment a run would get, imports mqcore.cli (most of a
run's half second of start-up) and then, for each command line, forks a process that runs
`mqcore.cli` as `-m` does: its own stdin, stdout and stderr (files the test passed over a Unix
socket), the test's working directory, `sys.argv[0]` the module's file, and the exit status
of a process (a signal's as its negative number). The fork is taken from an idle,
single-threaded interpreter that has opened nothing, so a run sees what a new interpreter
would, in the run's environment. A different environment (a test that set a variable) gets a
server of its own: what mqcore reads at import (MQCORE_CRASH_AT, the kernel switches) is read
with the run's values.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

SERVER = r"""
import json, os, runpy, socket, struct, sys, traceback
import mqcore.cli

sock = socket.socket(fileno=int(sys.argv[1]))
while True:
    msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
    if not msg:
        break
    cwd, argv, env = json.loads(msg)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        code = 1
        try:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["-m", *argv]
            runpy.run_module("mqcore.cli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                code = code or 120
        os._exit(code)
    for fd in fds:
        os.close(fd)
    sock.send(struct.pack("q", pid))
    sock.send(struct.pack("q", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
"""


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(theirs.fileno())],
            env=env,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()

    def run(
        self, argv: list[str], stdin: bytes, env: dict[str, str], timeout: float
    ) -> tuple[int, bytes, bytes]:
        with (
            tempfile.TemporaryFile() as fin,
            tempfile.TemporaryFile() as fout,
            tempfile.TemporaryFile() as ferr,
        ):
            fin.write(stdin)
            fin.seek(0)
            request = json.dumps([os.getcwd(), argv, env]).encode()
            socket.send_fds(self.sock, [request], [fin.fileno(), fout.fileno(), ferr.fileno()])
            self.sock.settimeout(30)
            (pid,) = struct.unpack("q", self.sock.recv(8))
            self.sock.settimeout(timeout)
            try:
                (code,) = struct.unpack("q", self.sock.recv(8))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self.sock.settimeout(30)
                self.sock.recv(8)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            fout.seek(0)
            ferr.seek(0)
            return code, fout.read(), ferr.read()

    def stop(self) -> None:
        self.sock.close()  # the server reads an empty message and exits
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# what changes from test to test and mqcore never reads: set in the run, not a new server
PER_TEST = {"PYTEST_CURRENT_TEST"}
_servers: dict[str, _Server] = {}
_lock = threading.Lock()  # one request at a time on the socket, from any thread


def _stop_all() -> None:
    while _servers:
        _servers.popitem()[1].stop()


atexit.register(_stop_all)


def run_module_cli(
    argv: list[str], stdin: bytes, env: dict[str, str], timeout: float
) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `python -m mqcore.cli *argv` in environment `env`."""
    key = json.dumps({k: v for k, v in env.items() if k not in PER_TEST}, sort_keys=True)
    with _lock:
        server = _servers.get(key)
        if server is None or server.proc.poll() is not None:
            _stop_all()  # one server at a time: an environment seldom comes back
            server = _servers[key] = _Server(env)
        return server.run(argv, stdin, env, timeout)
