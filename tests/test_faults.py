"""The fault matrix (serving.harden.faults): the proxy in front of a real loopback stub upstream that is
down, slow, failing, malformed or cut off; each fault gets the promised OpenAI-shaped error without a hang,
and the next request after the upstream heals succeeds."""

from __future__ import annotations

import httpx
import pytest

from serving.harden.faults import SCENARIOS, fault_env, run_scenario
from serving.harden.stub import StubUpstream


@pytest.fixture(scope="module")
def env(smol_tokenizer):
    with fault_env(smol_tokenizer, timeout_s=0.5) as e:
        yield e


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_fault_answered_and_survived(env, scenario):
    r = run_scenario(env, scenario)
    assert r.answered_right, f"{scenario.name}: want {r.expected}, got {r.got}"
    assert r.seconds <= env.timeout_s + 2.0
    assert r.recovered, f"{scenario.name}: the next request after the upstream healed failed"


def test_many_faults_in_a_row_leave_the_proxy_healthy(env):
    """Pooled connections that saw faults are not reused broken: a burst of good requests all pass."""
    for sc in SCENARIOS:
        run_scenario(env, sc)
    env.stub.mode = "ok"
    body = {"model": env.stub.model, "messages": [{"role": "user", "content": "Hi?"}], "documents": ["Hello there."]}
    statuses = [env.client.post(f"{env.base}/v1/chat/completions", json=body).status_code for _ in range(20)]
    assert statuses == [200] * 20
    assert env.client.get(f"{env.base}/v1/models").json()["data"][0]["id"] == env.stub.model


def test_stub_modes_misbehave_as_documented():
    """The stub itself, straight: without this a broken stub could make the matrix pass vacuously."""
    with StubUpstream(delay_s=0.3) as stub, httpx.Client(timeout=5) as c:
        body = {"model": "stub", "messages": [{"role": "user", "content": "x"}]}
        assert c.post(f"{stub.url}/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        stub.mode = "error_500"
        assert c.post(f"{stub.url}/chat/completions", json=body).status_code == 500
        stub.mode = "not_object"
        assert c.post(f"{stub.url}/chat/completions", json=body).json() == [1, 2, 3]
        stub.mode = "stream_closed"
        text = c.post(f"{stub.url}/chat/completions", json={**body, "stream": True}).text
        assert text.count("data: ") == 2 and "[DONE]" not in text
        stub.mode = "stream_cut"
        with pytest.raises(httpx.RemoteProtocolError):
            c.post(f"{stub.url}/chat/completions", json={**body, "stream": True})
        stub.mode = "slow"
        with pytest.raises(httpx.ReadTimeout):
            c.post(f"{stub.url}/chat/completions", json=body, timeout=0.1)
        stub.mode = "ok"
        port = stub.port
        stub.stop()
        with pytest.raises(httpx.ConnectError):
            c.get(f"http://127.0.0.1:{port}/v1/models")
        stub.start()
        assert stub.port == port and c.get(f"{stub.url}/models").status_code == 200
