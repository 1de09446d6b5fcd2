"""app.client, the stdlib client for the binary form, against a real server."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from app.client import ApiError, Client

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
