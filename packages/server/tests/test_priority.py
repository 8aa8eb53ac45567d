"""`--scheduling-policy priority` (vLLM's): a request's `priority` (lower first) orders the queue, and a
waiting request of higher priority preempts a running one, which is parked (its cache in the RAM prompt
cache) and resumes later with exactly the text it would have produced."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, assert_error, start_server, stop_server

LOW = {"prompt": "Write a long story about a lighthouse keeper.", "n_predict": 48, "ignore_eos": True}


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ("-c", "1024", "-np", "1", "--temp", "0", "--no-warmup", "--metrics")
    s = start_server(tmp_path_factory.mktemp("prio"), *args, "--scheduling-policy", "priority")
    yield s
    stop_server(s)


def _metric(c: httpx.Client, name: str) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(name)


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "sampled"])
def test_a_preempted_request_gives_the_text_it_gives_alone(one_slot: Server, seeded: bool) -> None:
    low = LOW | ({"temperature": 0.8, "seed": 42} if seeded else {})
    with one_slot.client() as c:
        alone = c.post("/completion", json=low | {"cache_prompt": False}).json()["content"]
        before = _metric(c, "n_preemptions_total")
        events: list[dict] = []
        urgent_done: list[float] = []

        def run_low() -> None:
            with (
                one_slot.client() as c2,
                c2.stream("POST", "/completion", json=low | {"stream": True, "priority": 5}) as r,
            ):
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]) | {"t": time.monotonic()})

        th = threading.Thread(target=run_low)
        th.start()
        while len(events) < 8:  # it is generating
            time.sleep(0.01)
        urgent = c.post("/completion", json={"prompt": "Say yes.", "n_predict": 4, "priority": 0})
        urgent_done.append(time.monotonic())
        th.join()
        assert urgent.status_code == 200, urgent.text
        text = "".join(e["content"] for e in events)
        assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 48
        assert text == alone  # parked and resumed: the same text
        assert urgent_done[0] < events[-1]["t"]  # the urgent request did not wait for the long one
        assert _metric(c, "n_preemptions_total") == before + 1


def test_equal_priority_does_not_preempt(one_slot: Server) -> None:
    with one_slot.client() as c:
        before = _metric(c, "n_preemptions_total")
        th = threading.Thread(
            target=lambda: httpx.post(
                one_slot.base_url + "/completion", json=LOW | {"priority": 1}, timeout=120
            )
        )
        th.start()
        time.sleep(0.3)
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2, "priority": 1})
        th.join()
        assert r.status_code == 200 and _metric(c, "n_preemptions_total") == before


def test_priority_needs_the_policy(client: httpx.Client) -> None:
    """The shared server runs fcfs: a non-zero priority is refused as vLLM refuses it."""
    err = assert_error(client.post("/completion", json={"prompt": "x", "n_predict": 1, "priority": 3}), 400)
    assert err["message"] == "Got priority 3 but Priority scheduling is not enabled."
    assert client.post("/completion", json={"prompt": "x", "n_predict": 1, "priority": 0}).status_code == 200


def test_the_queue_shows_in_slots(one_slot: Server) -> None:
    """`/slots?queue=1`: the slots and the waiting requests in the order they will be admitted."""
    with one_slot.client() as c:
        bodies = [LOW | {"priority": 5, "n_predict": 400}, {"prompt": "a b c", "n_predict": 2, "priority": 7}]
        bodies.append({"prompt": "d e f g", "n_predict": 2, "priority": 6})
        threads = []
        for body in bodies:
            th = threading.Thread(
                target=lambda b=body: httpx.post(one_slot.base_url + "/completion", json=b, timeout=120)
            )
            th.start()
            threads.append(th)
            time.sleep(0.1)  # in this order
        deadline = time.monotonic() + 20  # both reach the engine's queue (tokenized, then taken by its loop)
        while len((view := c.get("/slots?queue=1").json())["queue"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        for th in threads:
            th.join()
    assert view["slots"][0]["is_processing"] is True and view["slots"][0]["priority"] == 5, view
    queue = view["queue"]
    assert [(q["position"], q["priority"], q["mine"], q["preempted"]) for q in queue] == [
        (0, 6, True, False),
        (1, 7, True, False),
    ]
    assert queue[0]["n_prompt_tokens"] > 0 and queue[1]["waited_ms"] > queue[0]["waited_ms"]
    assert view["n_waiting"] == 2
