"""app.client, the stdlib client for the binary form, against a real server."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from attnscope.python.client import ApiError, Client

TEXT = "The cat sat on the mat because it was tired."


def test_client_decodes_what_json_clients_get(live_server):
    api = Client(live_server)
    ans = api.attention(TEXT, layers=[1, 4], heads=[0, 7])
    ref = httpx.post(f"{live_server}/api/attention", json={"text": TEXT, "layers": [1, 4], "heads": [0, 7]}).json()
    assert ans["tokens"] == ref["tokens"] and ans["attention"].shape == (2, 2, len(ref["tokens"]), len(ref["tokens"]))
    np.testing.assert_array_equal(ans["attention"], np.array(ref["attention"], np.float32))
    np.testing.assert_array_equal(ans["entropy"], np.array(ref["entropy"], np.float32))
    st = api.stages(TEXT, layer=0, head=1, model="tiny-gpt")
    assert st["probs"].shape == (len(st["tokens"]),) * 2 and st["causal"] is True
    api.close()


def test_client_raises_the_servers_message(live_server):
    api = Client(live_server)
    with pytest.raises(ApiError, match="layers \\[9\\] out of range") as e:
        api.attention(TEXT, layers=[9])
    assert e.value.status == 422
    assert api.attention("again")["tokens"][0] == "[CLS]"  # the connection is still usable


def test_client_large_answer_on_huge_page_buffer(live_server):
    api = Client(live_server)
    text = "word " * 200
    ans = api.attention(text, include=["attention"])                  # 6 x 12 x 202 x 202 floats: 11.7 MB
    ref = httpx.post(f"{live_server}/api/attention", json={"text": text, "layers": [5], "heads": [11]}).json()
    np.testing.assert_array_equal(ans["attention"][5, 11], np.array(ref["attention"][0][0], np.float32))
    np.testing.assert_allclose(ans["attention"].sum(-1), 1.0, atol=1e-6)


def test_a_call_that_outlasts_its_timeout_ends_and_the_next_call_is_timed_afresh():
    """The client's timeout bounds a whole call, not each read: a server that sends its answer a byte at a time
    (each read well within the socket timeout) is cut off when the call's time is up (the client's one deadline
    thread shuts the socket, the answer's own once `Connection: close` took it from the connection), with status 0;
    the next call, to a prompt server, gets its own full time."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    slow = threading.Event()

    def serve():
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                body = b'{"models": []}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
                try:
                    for i in range(len(body)):
                        conn.sendall(body[i:i + 1])
                        if slow.is_set():
                            time.sleep(0.2)      # 14 bytes: 2.8 s, each read 0.2 s apart
                except OSError:                  # the client has gone
                    pass
    threading.Thread(target=serve, daemon=True).start()
    api = Client(f"http://127.0.0.1:{port}", timeout=1.0)
    slow.set()
    t0 = time.monotonic()
    with pytest.raises(ApiError, match="within the client's timeout of 1 s") as e:
        api._json("GET", "/api/models")
    assert e.value.status == 0 and 0.9 < time.monotonic() - t0 < 2.0
    slow.clear()
    assert api._json("GET", "/api/models") == {"models": []}      # armed afresh, not cut off by the last deadline
    listener.close()


def test_a_request_leaves_in_one_write():
    """python/client._Connection: a request's head and body go out in one write (http.client sends them apart, and
    the head alone woke the server); a chunked body goes as http.client sends it."""
    import socket

    from attnscope.python.client import _Connection

    class Recording(socket.socket):
        def sendall(self, data, *args):
            self.sent.append(bytes(data))
            return super().sendall(data, *args)

    ours, peer = socket.socketpair()
    sock = Recording(fileno=ours.detach())
    sock.sent = []
    conn = _Connection("127.0.0.1", 1)
    conn.sock = sock
    body = b'{"model": "minilm", "text": "two words"}'
    conn.request("POST", "/api/attention", body, {"Content-Type": "application/json"})
    assert len(sock.sent) == 1 and sock.sent[0].startswith(b"POST /api/attention HTTP/1.1\r\n")
    head, sent_body = sock.sent[0].split(b"\r\n\r\n", 1)
    assert sent_body == body and b"Content-Length: %d" % len(body) in head
    assert peer.recv(1 << 16) == sock.sent[0]
    conn.close()
    peer.close()
