"""Reads `qwen-gdn serve`'s /metrics with the Prometheus project's own OpenMetrics parser
(`prometheus_client`), after the client scripts ran against the server (run by
scripts/test-serve-clients.sh).

    python scripts/test_serve_metrics.py BASE_URL API_KEY
"""

import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families

base, key = sys.argv[1:3]
request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"})
with urllib.request.urlopen(request) as r:
    content_type = r.headers["Content-Type"]
    text = r.read().decode()
assert content_type.startswith("application/openmetrics-text"), content_type
families = {f.name: f for f in text_string_to_metric_families(text)}
want = {
    "qwen_gdn_http_requests": "counter",
    "qwen_gdn_generations": "counter",
    "qwen_gdn_prompt_tokens": "counter",
    "qwen_gdn_generation_tokens": "counter",
    "qwen_gdn_prompt_cache_hits": "counter",
    "qwen_gdn_prompt_cache_misses": "counter",
    "qwen_gdn_prompt_cache_tokens": "counter",
    "qwen_gdn_prompt_cache_bytes": "gauge",
    "qwen_gdn_prompt_cache_budget_bytes": "gauge",
    "qwen_gdn_prompt_cache_entries": "gauge",
    "qwen_gdn_queue_depth": "gauge",
    "qwen_gdn_requests_running": "gauge",
    "qwen_gdn_time_to_first_token_seconds": "histogram",
    "qwen_gdn_generation_tokens_per_second": "histogram",
}
for name, kind in want.items():
    assert name in families and families[name].type == kind, (name, families.get(name))


def value(family, suffix="_total", **labels):
    return sum(
        s.value
        for s in families[family].samples
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    )


for api in ("openai", "anthropic", "ollama"):
    assert value("qwen_gdn_http_requests", api=api, status="200") > 0, api
assert value("qwen_gdn_http_requests", api="anthropic", status="404") > 0
assert value("qwen_gdn_generation_tokens") > 0 and value("qwen_gdn_prompt_tokens") > 0
assert value("qwen_gdn_prompt_cache_hits") > 0 and value("qwen_gdn_prompt_cache_tokens") > 0
assert value("qwen_gdn_prompt_cache_bytes", suffix="") > 0
assert value("qwen_gdn_queue_depth", suffix="") == 0
assert value("qwen_gdn_time_to_first_token_seconds", suffix="_count") > 0
print(f"metrics: {len(families)} families parsed, {int(value('qwen_gdn_generation_tokens'))} tokens generated")
