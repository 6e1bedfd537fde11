#!/usr/bin/env python3
"""A client of `qwen-gdn serve` for scripts/test-mpi-serve.sh (standard library only).

    serve_ranks_client.py URL MODE MESSAGES_JSON MAX_TOKENS [EXTRA_JSON]

URL is the server's /v1 base; MODE is `plain` (one response), `stream` (server-sent events,
the deltas joined) or `leave` (streamed, the connection closed after the first piece of
text). Prints one JSON line: {"text": ..., "cached": ..., "finish": ...} (`leave`: the
first piece only). Greedy (temperature 0) unless EXTRA_JSON (fields added to the request,
e.g. stop strings, a temperature and a seed) says otherwise."""

import json
import sys
import urllib.request


def post(url, body):
    request = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    return urllib.request.urlopen(request, timeout=120)


def main():
    url, mode, messages, max_tokens = sys.argv[1:5]
    body = {
        "messages": json.loads(messages),
        "max_tokens": int(max_tokens),
        "temperature": 0,
    }
    if len(sys.argv) > 5:
        body.update(json.loads(sys.argv[5]))
    if mode == "plain":
        with post(url, body) as response:
            reply = json.load(response)
        choice = reply["choices"][0]
        cached = reply["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        print(json.dumps({"text": choice["message"]["content"], "cached": cached,
                          "finish": choice["finish_reason"]}))
        return
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    text, cached, finish = "", None, None
    with post(url, body) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            for choice in event.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage")
            if usage:
                cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            if mode == "leave" and text:
                break  # closing the connection mid-stream
    print(json.dumps({"text": text, "cached": cached, "finish": finish}))


if __name__ == "__main__":
    main()
