"""`mqcore serve` fed by nginx through lua-nginx-kafka (Debian 12: lua-resty-kafka 0.07, a
Kafka producer written in Lua, for nginx's Lua module): an nginx of ours
(tests/clients/nginx.conf) turns each POST into one message sent with the library's
synchronous producer at a given Produce version (0, 1 or 2: its choices), and answers the
offset after it that the library computes from the broker's answer. Every message must land
in order at those offsets. `make test-tools`
installs nginx-light, libnginx-mod-http-lua and lua-nginx-kafka as root; without them the
test skips."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from typing import Any

import pytest
from clients.harness import fill_config, free_port, running, tail, wait_for

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytestmark = pytest.mark.slow  # outside programs: a build, a daemon or an interpreter each

LUA_MODULE = "/usr/lib/nginx/modules/ngx_http_lua_module.so"
LIBRARY = "/usr/share/lua/5.1/nginx/kafka/producer.lua"
N = 20


def post(address: str, path: str, body: bytes) -> tuple[int, str]:
    """POST `body` to nginx; (status, text)."""
    request = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode().strip()


def listening(address: str) -> bool:
    try:
        urllib.request.urlopen(f"http://{address}/", timeout=2).close()
    except urllib.error.HTTPError:
        return True  # it answers (404 for /)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("version", [0, 1, 2])
def test_lua_nginx_kafka_produces(
    kafka_server: Any, store: mqcore.Store, tmp_path: Any, version: int
) -> None:
    """N messages, one POST each: nginx answers 1..N (each message's offset + 1), and the
    store holds the keys and bodies in that order."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if nginx is None or not os.path.exists(LUA_MODULE) or not os.path.exists(LIBRARY):
        pytest.skip("nginx with lua-nginx-kafka is not installed (apt-get install nginx-light "
                    "libnginx-mod-http-lua lua-nginx-kafka; make test-tools)")  # fmt: skip
    store.create_topic("web")
    host, port = kafka_server.bootstrap.rsplit(":", 1)
    listen = f"127.0.0.1:{free_port()}"
    conf = fill_config("nginx.conf", str(tmp_path / "nginx.conf"), dir=str(tmp_path),
                       listen=listen, kafka_host=host, kafka_port=port)  # fmt: skip
    log = str(tmp_path / "error.log")
    argv = [nginx, "-p", str(tmp_path), "-c", conf, "-e", log]
    with running(argv, str(tmp_path / "nginx.out")) as proc:
        wait_for(lambda: listening(listen) or proc.poll() is not None, "nginx to listen")
        assert proc.poll() is None, tail(str(tmp_path / "nginx.out")) + tail(log)
        answers = [
            post(listen, f"/produce?topic=web&key=k{i}&v={version}", b"request %d" % i)
            for i in range(N)
        ]
    assert answers == [(200, str(i + 1)) for i in range(N)], f"{answers[:3]}\n{tail(log)}"
    assert [(m.key, m.value) for m in store.read("web", 0, 0, 2 * N)] == [
        (b"k%d" % i, b"request %d" % i) for i in range(N)
    ]
