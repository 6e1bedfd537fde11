"""The load test of serve's continuous batching with the official `openai` client (run by
scripts/test-serve-clients.sh against a server with a small --max-batch and --queue-size):
64 concurrent clients on 127.0.0.1, plain and streamed, completions and chat, mixed lengths,
some hanging up mid-stream and some asking for n=2 sampled choices with a seed. Checks:
- every request that completes gives the text it gives alone (greedy; measured first, one
  request at a time) and a finish_reason, streamed or not;
- every n=2 request that completes gives two choices, choice i equal to the reply alone with
  n=1 and seed + i (the seed rule; sampled, so the seeds matter);
- every other request gets a clean error: 503 (queue full), in OpenAI's shape;
- no stream ends without [DONE] or an error;
- requests ran together (the running gauge of /metrics went past 1);
- the server is healthy after, with nothing left running or queued.
Bounded: 64 clients, at most 32 tokens each, every call under a timeout; stops by itself.

    python scripts/test_serve_load.py BASE_URL API_KEY MODEL
"""

import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

base, key, model = sys.argv[1:4]
CLIENTS = 64
TIMEOUT = 120

# (kind, prompt, max_tokens): completions take raw text; chat goes through the template.
KINDS = [
    ("text", "Once upon a time", 32),
    ("text", "The capital of France is", 5),
    ("text", "1, 2, 3, 4,", 17),
    ("text", "def main():", 24),
    ("text", "Dear friend,", 11),
    ("chat", "Tell me about the sea", 20),
    ("chat", "Hello there", 8),
    ("chat", "Count to ten", 28),
]


def client():
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)


# The sampling of the n=2 requests: choice i is the reply alone with seed SEED + i.
SAMPLED = dict(temperature=0.8, seed=11)


def ask(c, kind, prompt, max_tokens, stream, cancel_after=None, n=1, sampling=None):
    """[(text, finish_reason)] of one request, one per choice; None when the client hung up
    on purpose."""
    common = dict(model=model, max_tokens=max_tokens, n=n, **(sampling or dict(temperature=0)))
    if kind == "chat":
        call = lambda **kw: c.chat.completions.create(  # noqa: E731
            messages=[{"role": "user", "content": prompt}],
            extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **common, **kw)
        piece = lambda choice: (choice.delta.content or "") if stream else choice.message.content  # noqa: E731
    else:
        call = lambda **kw: c.completions.create(prompt=prompt, **common, **kw)  # noqa: E731
        piece = lambda choice: choice.text or ""  # noqa: E731
    if not stream:
        choices = sorted(call().choices, key=lambda choice: choice.index)
        assert [choice.index for choice in choices] == list(range(n)), choices
        return [(piece(choice), choice.finish_reason) for choice in choices]
    texts, finishes, chunks = [""] * n, [None] * n, 0
    with call(stream=True) as s:
        for chunk in s:
            if not chunk.choices:
                continue
            for choice in chunk.choices:
                texts[choice.index] += piece(choice)
                finishes[choice.index] = choice.finish_reason or finishes[choice.index]
            chunks += 1
            if cancel_after is not None and chunks >= cancel_after:
                return None  # leaving the with block closes the connection
    # The client's iterator ends at [DONE]; a cut connection raises instead.
    if None in finishes:
        raise AssertionError(f"a stream ended without a finish_reason: {texts!r}")
    return list(zip(texts, finishes))


def running_gauge():
    req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("qwen_gdn_requests_running "):
                return float(line.split()[1])
    return 0.0


def is_n2(i):
    return i % 16 == 6


alone, alone_n2 = {}, {}
c = client()
for kind, prompt, max_tokens in KINDS:
    alone[(kind, prompt)] = ask(c, kind, prompt, max_tokens, stream=False)
    assert alone[(kind, prompt)][0][0], f"no text alone for {prompt!r}"
for kind, prompt, max_tokens in {KINDS[i % len(KINDS)] for i in range(CLIENTS) if is_n2(i)}:
    seeded = [dict(SAMPLED, seed=SAMPLED["seed"] + i) for i in range(2)]
    alone_n2[(kind, prompt)] = [ask(c, kind, prompt, max_tokens, False, sampling=s)[0] for s in seeded]
    assert alone_n2[(kind, prompt)][0] != alone_n2[(kind, prompt)][1], "the seeds made no difference"

widest = [0.0]
stop = threading.Event()


def watch():
    while not stop.is_set():
        widest[0] = max(widest[0], running_gauge())
        time.sleep(0.02)


def one(i):
    kind, prompt, max_tokens = KINDS[i % len(KINDS)]
    stream = i % 2 == 1
    cancel_after = 2 if i % 8 == 3 else None
    n, sampling, want = 1, None, alone[(kind, prompt)]
    if is_n2(i):
        n, sampling, want = 2, SAMPLED, alone_n2[(kind, prompt)]
    try:
        got = ask(client(), kind, prompt, max_tokens, stream, cancel_after, n, sampling)
    except openai.APIStatusError as e:
        body = e.response.json()
        assert {"message", "type", "param", "code"} <= body["error"].keys(), body
        if e.status_code == 503:
            return "503"
        raise AssertionError(f"client {i}: unexpected {e.status_code}: {body}")
    if got is None:
        return "cancelled"
    assert got == want, f"client {i} ({kind} {prompt!r}, n={n}, stream={stream}): {got} != alone {want}"
    return "same" if n == 1 else "same n=2"


watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
start = time.monotonic()
with ThreadPoolExecutor(CLIENTS) as pool:
    outcomes = list(pool.map(one, range(CLIENTS), timeout=600))
stop.set()
watcher.join()
elapsed = time.monotonic() - start
counts = {k: outcomes.count(k) for k in sorted(set(outcomes))}
print(f"load: {CLIENTS} clients in {elapsed:.1f} s: {counts}; at most {widest[0]:.0f} running together")
assert counts.get("same", 0) >= CLIENTS // 4, counts
assert widest[0] > 1, "the requests never ran together"

# Healthy after: /health, a request alone gives its text, nothing left running or queued.
with urllib.request.urlopen(f"{base}/health", timeout=10) as r:
    assert r.status == 200
kind, prompt, max_tokens = KINDS[0]
assert ask(client(), kind, prompt, max_tokens, stream=True) == alone[(kind, prompt)]
# n=2 streamed, whatever the load let through: each choice its reply alone with seed + i.
(kind, prompt), want = next(iter(alone_n2.items()))
max_tokens = next(m for k, p, m in KINDS if (k, p) == (kind, prompt))
assert ask(client(), kind, prompt, max_tokens, stream=True, n=2, sampling=SAMPLED) == want
for _ in range(100):
    if running_gauge() == 0:
        break
    time.sleep(0.1)
assert running_gauge() == 0, "generations still running after the load"
