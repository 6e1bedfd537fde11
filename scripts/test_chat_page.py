"""The chat page at `/` in a real headless browser: Debian's Chromium driven by Selenium
(pinned in scripts/requirements-chat-page-test.txt; run by scripts/test-chat-page.sh).

    python scripts/test_chat_page.py QWEN_GDN MODEL_DIR ARTEFACT_DIR

Starts two servers with --api-key on free ports: one on the tiny model (slowed by the
debug-build switch QWEN_GDN_TEST_TOKEN_DELAY_MS so that a reply can be stopped mid-stream
and its pieces seen arriving), and one whose reply is forced (QWEN_GDN_TEST_FORCE_OUTPUT) to
thinking, text holding HTML and script, and a tool call, since the tiny model prints
gibberish. On the page: a send refused for the missing key, the key typed in, a streamed
reply equal to the OpenAI endpoint's greedy text for the same conversation, copy,
regenerate, settings refused by the page and by the server, stop, a user message holding
HTML shown as text, a reload that finds the conversation, deleting it, a second tab's
conversation kept, and the forced reply shown as the API returns it (thinking folded, the
tool call, markup as text, no script run), and the call answered from the page. Then: every
request the browser made went to 127.0.0.1 (Chrome's network log and the page's resource
entries), the page's Content-Security-Policy refuses other origins, and screenshots are left
in ARTEFACT_DIR.
Every check raises on failure.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from serve_client_checks import Checks

binary, model, artefacts = sys.argv[1:4]
artefacts = Path(artefacts)
artefacts.mkdir(parents=True, exist_ok=True)
key = f"page-key-{os.getpid()}"
check = Checks()
SLOW = 300  # seconds any wait may take on a loaded CI machine (debug build)

FORCED = (
    'Weighing <b>bold</b> & "quotes"\n</think>\n\n'
    "Here is <script>window.__pwned = 'reply script'</script>"
    "<img src=\"/page/x.png\" onerror=\"window.__pwned = 'reply img'\"> for you.\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>"
)
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def start_server(log_dir, name, **env):
    """Starts `qwen-gdn serve` on a free port; returns (process, base URL)."""
    log = open(Path(log_dir) / f"{name}.log", "w+")
    process = subprocess.Popen(
        [binary, "serve", "--model", model, "--port", "0", "--api-key", key],
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **env},
    )
    deadline = time.time() + SLOW
    while time.time() < deadline:
        log.seek(0)
        found = re.search(r"http://[0-9.]+:[0-9]+", log.read())
        if found:
            return process, found.group(0)
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the {name} server exited: {log.read()}")
        time.sleep(0.1)
    raise RuntimeError(f"the {name} server did not start")


def api(base, path, body=None):
    request = urllib.request.Request(
        base + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=SLOW) as response:
        text = response.read().decode()
    return text if path == "/metrics" else json.loads(text)


def cancelled_generations(base):
    found = re.search(r'^qwen_gdn_generations_total\{finish="cancelled"\} (\S+)', api(base, "/metrics"), re.M)
    return float(found.group(1)) if found else 0.0


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--no-first-run", "--disable-background-networking", "--disable-component-update"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def wait(driver, condition, what):
    try:
        return WebDriverWait(driver, SLOW, poll_frequency=0.05).until(lambda d: condition())
    except Exception as e:
        raise AssertionError(f"timed out waiting for {what}") from e


def js(driver, script, *args):
    return driver.execute_script(script, *args)


def type_into(driver, element_id, text):
    """Replaces a field's text as a user would (the page saves settings on `input`)."""
    field = driver.find_element(By.ID, element_id)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    if text:
        field.send_keys(text)


def settings(driver, **fields):
    if driver.find_element(By.ID, "settings").get_attribute("hidden") is not None:
        driver.find_element(By.ID, "settings-toggle").click()
    for element_id, value in fields.items():
        element_id = element_id.replace("_", "-")
        if element_id == "thinking":
            Select(driver.find_element(By.ID, "thinking")).select_by_value(value)
        else:
            type_into(driver, element_id, value)


def busy(driver):
    return js(driver, "return document.body.dataset.busy") == "true"


def send(driver, text):
    type_into(driver, "input", text)
    driver.find_element(By.ID, "send").click()


def texts(driver, selector):
    return js(driver, "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", selector)


def last_reply(driver):
    return texts(driver, "#messages .message.assistant .content")[-1]


def record_stream(driver):
    """From now on, every text the last reply shows is recorded in window.__seen."""
    js(driver, """
        window.__seen = [];
        new MutationObserver(() => {
          const c = [...document.querySelectorAll('#messages .message.assistant .content')].at(-1);
          if (c && window.__seen.at(-1) !== c.textContent) window.__seen.push(c.textContent);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    """)


def no_markup_ran(driver, where):
    check(js(driver, "return document.querySelectorAll('#messages script, #messages img').length") == 0,
          f"{where}: markup became elements")
    check(js(driver, "return window.__pwned === undefined"), f"{where}: script ran: {js(driver, 'return window.__pwned')}")


network = []  # every URL the browser requested, from Chrome's performance log


def drain_network(driver):
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            network.append(message["params"]["request"]["url"])


def resources_from(driver, base, where):
    names = js(driver, "return performance.getEntries().map(e => e.name).filter(n => n.includes(':'))")
    check(names and all(n.startswith(base + "/") for n in names), f"{where}: resources outside {base}: {names}")


def uncaught_errors(driver):
    """Script errors in the console (the refused requests' network entries are expected)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE" and e["source"] != "network"]


with tempfile.TemporaryDirectory() as logs:
    servers = []
    driver = None
    try:
        process, base = start_server(logs, "model", QWEN_GDN_TEST_TOKEN_DELAY_MS="25")
        servers.append(process)
        process, forced_base = start_server(logs, "forced", QWEN_GDN_TEST_FORCE_OUTPUT=FORCED)
        servers.append(process)
        driver = browser()

        # The page loads without the key (it holds no secret); the API refuses without it.
        driver.get(base + "/")
        wait(driver, lambda: "API key" in driver.find_element(By.ID, "model-name").text, "the model name's key hint")
        system = "You are a terse assistant."
        driver.find_element(By.CSS_SELECTOR, "#system-box summary").click()
        type_into(driver, "system", system)
        question = "Tell me about the sea"
        send(driver, question)
        wait(driver, lambda: driver.find_element(By.ID, "error").is_displayed(), "the 401 error")
        check("401" in driver.find_element(By.ID, "error").text, driver.find_element(By.ID, "error").text)
        check(driver.find_element(By.ID, "input").get_attribute("value") == question, "the refused message given back")
        check(texts(driver, "#messages .message") == [], "a refused send leaves no messages")

        # With the key: a streamed greedy reply equal to the OpenAI endpoint's.
        settings(driver, api_key=key, temperature="0", max_tokens="16", thinking="off")
        wait(driver, lambda: "API key" not in driver.find_element(By.ID, "model-name").text, "the model name")
        record_stream(driver)
        driver.find_element(By.ID, "send").click()
        wait(driver, lambda: texts(driver, ".message.assistant") and not busy(driver), "the first reply")
        reference = api(base, "/v1/chat/completions", {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False},
        })["choices"][0]["message"]["content"]
        reply = last_reply(driver)
        check(reply == reference and reply, f"page {reply!r} != API {reference!r}")
        seen = js(driver, "return window.__seen")
        partial = [s for s in seen if s and s != reply]
        check(partial and all(reply.startswith(s) for s in seen), f"not streamed in pieces: {seen}")
        check(not driver.find_element(By.ID, "error").is_displayed(), "an error left shown")
        meta = driver.find_element(By.CSS_SELECTOR, ".message.assistant .meta").text
        check("finish: " in meta and "tokens" in meta, meta)

        # Copy gives the reply's text as it is (the clipboard replaced by a recorder).
        js(driver, "navigator.clipboard.writeText = (t) => { window.__copied = t; return Promise.resolve(); }")
        driver.find_elements(By.CSS_SELECTOR, ".message.assistant .copy")[-1].click()
        wait(driver, lambda: js(driver, "return window.__copied") is not None, "the copy")
        check(js(driver, "return window.__copied") == reply, "copied text")

        # Regenerate: the last reply replaced by a new one, greedy again.
        driver.find_element(By.CSS_SELECTOR, ".message.assistant .regenerate").click()
        wait(driver, lambda: busy(driver), "regenerate starting")
        wait(driver, lambda: not busy(driver), "the regenerated reply")
        check(texts(driver, "#messages .message .content") == [question, reference], "regenerated conversation")

        # A setting that is not a number is refused in the page, one out of range by the
        # server; either way nothing is added and the text goes back to the composer.
        conversation = texts(driver, "#messages .message .content")
        for field, value, says in (("top_k", "abc", "top_k: "), ("min_p", "3", "400: ")):
            settings(driver, **{field: value})
            send(driver, "Refused")
            shown = driver.find_element(By.ID, "settings-error" if value == "abc" else "error")
            wait(driver, lambda: says in shown.text, f"the refusal of {field}={value}")
            check(field in shown.text, shown.text)
            check(driver.find_element(By.ID, "input").get_attribute("value") == "Refused", "the text given back")
            check(texts(driver, "#messages .message .content") == conversation, "a refused send changed the conversation")
            settings(driver, **{field: ""})

        # Stop mid-stream: the text stops growing, the reply is marked stopped, and the server
        # cancelled its generation.
        cancelled = cancelled_generations(base)
        settings(driver, max_tokens="400")
        send(driver, "Write a long story about ships")
        wait(driver, lambda: busy(driver) and len(last_reply(driver)) >= 6, "a reply under way")
        driver.find_element(By.ID, "stop").click()
        wait(driver, lambda: not busy(driver), "the stop")
        stopped = last_reply(driver)
        time.sleep(0.5)
        check(last_reply(driver) == stopped, "the reply grew after the stop")
        meta = driver.find_elements(By.CSS_SELECTOR, ".message.assistant .meta")[-1].text
        check(meta.startswith("stopped"), meta)
        wait(driver, lambda: cancelled_generations(base) > cancelled, "the server's cancelled generation")

        # A user message holding markup shows as text and runs nothing.
        markup = "<img src=\"/page/y.png\" onerror=\"window.__pwned = 'user img'\"><script>window.__pwned = 'user script'</script>"
        settings(driver, max_tokens="4")
        type_into(driver, "input", markup)
        driver.find_element(By.ID, "input").send_keys(Keys.ENTER)  # Enter sends
        wait(driver, lambda: len(texts(driver, ".message.assistant")) == 3 and not busy(driver), "the fourth reply")
        check(texts(driver, "#messages .message.user .content")[-1] == markup, "the markup message")
        no_markup_ran(driver, "user message")

        # Reload: the conversation, the settings and the key come back from localStorage.
        before = texts(driver, "#messages .message .content")
        check(len(before) == 6, before)
        driver.refresh()
        wait(driver, lambda: len(texts(driver, "#messages .message")) == 6, "the conversation after reload")
        check(texts(driver, "#messages .message .content") == before, "the conversation after reload")
        check(texts(driver, "#conversations li .open") == [question], texts(driver, "#conversations li .open"))
        check(driver.find_element(By.ID, "system").get_attribute("value") == system, "the system prompt after reload")
        check(driver.find_element(By.ID, "api-key").get_attribute("value") == key, "the key after reload")
        driver.find_element(By.ID, "new-chat").click()
        check(texts(driver, "#messages .message") == [], "new chat")
        driver.find_element(By.CSS_SELECTOR, "#conversations li .open").click()
        check(texts(driver, "#messages .message .content") == before, "the conversation opened from the list")
        no_markup_ran(driver, "after reload")
        driver.save_screenshot(str(artefacts / "chat-page-conversation.png"))
        resources_from(driver, base, "the model's page")

        # Deleting the conversation removes it from the page and from storage.
        driver.find_element(By.CSS_SELECTOR, "#conversations li .delete").click()
        check(texts(driver, "#conversations li") == [] and texts(driver, "#messages .message") == [], "deleted")
        driver.refresh()
        wait(driver, lambda: js(driver, "return document.body.dataset.busy") == "false", "the page after reload")
        check(texts(driver, "#conversations li") == [] and texts(driver, "#messages .message") == [], "deleted, reloaded")

        # Two tabs: a conversation made in the second shows in the first's list, and the first
        # saving its own keeps it.
        first = driver.current_window_handle
        driver.switch_to.new_window("tab")
        driver.get(base + "/")
        send(driver, "From the second tab")
        wait(driver, lambda: texts(driver, ".message.assistant") and not busy(driver), "the second tab's reply")
        resources_from(driver, base, "the second tab")
        driver.close()
        driver.switch_to.window(first)
        wait(driver, lambda: texts(driver, "#conversations li .open") == ["From the second tab"], "the other tab's conversation")
        send(driver, "From the first tab")
        wait(driver, lambda: texts(driver, ".message.assistant") and not busy(driver), "the first tab's reply")
        stored = js(driver, "return JSON.parse(localStorage.getItem('qwen-gdn.conversations')).map(c => c.title)")
        check(sorted(stored) == ["From the first tab", "From the second tab"], stored)
        errors = uncaught_errors(driver)
        check(not errors, f"console errors: {errors}")

        # The forced reply, shown as the API gives it: thinking folded, markup as text, the call.
        driver.get(forced_base + "/")
        settings(driver, api_key=key, tools=json.dumps(TOOLS))
        driver.find_element(By.ID, "settings-toggle").click()
        question = "What is the weather in Paris?"
        send(driver, question)
        wait(driver, lambda: texts(driver, ".message.assistant") and not busy(driver), "the forced reply")
        want = api(forced_base, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": question}], "tools": TOOLS,
        })["choices"][0]["message"]
        check("<script>" in want["content"] and want["reasoning_content"] and want["tool_calls"], want)
        check(last_reply(driver) == want["content"], f"{last_reply(driver)!r} != {want['content']!r}")
        check(texts(driver, ".thinking-text") == [want["reasoning_content"]], texts(driver, ".thinking-text"))
        check(js(driver, "const t = document.querySelector('.thinking'); return !t.hidden && !t.open"), "thinking not folded")
        call = want["tool_calls"][0]["function"]
        check(texts(driver, ".tool-name") == [f"Tool call: {call['name']}"], texts(driver, ".tool-name"))
        shown = texts(driver, ".tool-arguments")
        check(len(shown) == 1 and json.loads(shown[0]) == json.loads(call["arguments"]), shown)
        check("finish: tool_calls" in driver.find_element(By.CSS_SELECTOR, ".message.assistant .meta").text, "finish")
        no_markup_ran(driver, "forced reply")
        driver.save_screenshot(str(artefacts / "chat-page.png"))

        # The call answered from the page: the result goes back as a tool message and the
        # model replies again (the forced text once more).
        result = "Sunny <b>21 °C</b>"
        driver.find_element(By.CSS_SELECTOR, ".tool-result").send_keys(result)
        driver.find_element(By.CSS_SELECTOR, ".send-results").click()
        wait(driver, lambda: len(texts(driver, ".message.assistant")) == 2 and not busy(driver), "the reply to the result")
        check(texts(driver, "#messages .message .role") == ["You", "Model", "Tool result: get_weather", "Model"],
              texts(driver, "#messages .message .role"))
        check(texts(driver, ".message.tool .content") == [result], texts(driver, ".message.tool .content"))
        check(last_reply(driver) == want["content"] and not driver.find_element(By.ID, "error").is_displayed(),
              "the reply to the tool result")
        check(js(driver, """return document.querySelectorAll('.tool-results').length === 1 &&
                 [...document.querySelectorAll('.message.assistant')].at(-1).querySelector('.tool-results') !== null"""),
              "the result form only under the last reply")
        no_markup_ran(driver, "tool result")
        resources_from(driver, forced_base, "the forced page")
        errors = uncaught_errors(driver)
        check(not errors, f"console errors: {errors}")

        # Every request the browser made went to one of the two servers.
        drain_network(driver)
        outside = [u for u in network if not (u.startswith(base + "/") or u.startswith(forced_base + "/"))]
        check(network and not outside, f"requests outside 127.0.0.1: {outside}")
        check(any(u.endswith("/page/app.js") for u in network), "the network log saw the page's script")

        # The Content-Security-Policy refuses a connection and an image from another origin.
        for probe in ("fetch('http://192.0.2.1/probe').catch(() => {})", "new Image().src = 'http://192.0.2.1/x.png'"):
            refused = driver.execute_async_script(f"""
                const done = arguments[arguments.length - 1];
                document.addEventListener('securitypolicyviolation',
                    (e) => done(e.effectiveDirective), {{once: true}});
                setTimeout(() => done(null), 10000);
                {probe};
            """)
            check(refused in ("connect-src", "img-src"), f"{probe}: not refused by the policy ({refused})")
    finally:
        if driver is not None:
            driver.quit()
        for process in servers:
            process.terminate()
            process.wait()

print(f"chat page: {check.count} checks passed; screenshots in {artefacts}")
