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
