"""The page at / and the stream's `specgen` extension it reads: where each token came from, tok/s
and τ as the run goes. The extension through OpenAI's own client, and the page in a real browser
(Debian's chromium, headless, driven by Selenium) against a real server process on smollm2; the
screenshot is saved under the test's temporary folder; docs/img/serve-page.png (tracked) is
rewritten from it only on request:

    SPECGEN_UPDATE_SCREENSHOT=1 pytest tests/test_serve_page.py -k browser"""

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from specgen.serve.marks import Mark, Sources
from harness import server as shared

SHOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "serve-page.png"
# Text the model is asked to repeat: its second and third copies are drafted by lookup.
REPEAT = 'Write the sentence "the quick brown fox jumps over the lazy dog" five times, one per line.'
MAX_TOKENS = 64
DRAFTED = {"lookup", "loop", "history", "store", "corpus", "draft", "staged", "draft+lookup"}


def test_sources_split_a_stretch_of_text_by_the_tokens_that_wrote_it():  # and give their ids
    s = Sources()
    text = ""
    for token, (piece, source) in enumerate([("ab", "target"), ("", "lookup"), ("cd", "lookup"), ("e", "lookup"),
                                             ("fg", "target")]):
        s.add(len(text), source, token)
        text += piece
    assert s.cut(text, 0, len(text)) == (Mark("ab", "target"), Mark("cde", "lookup"), Mark("fg", "target"))
    assert s.cut(text, 1, 4) == (Mark("b", "target"), Mark("cd", "lookup"))
    assert s.cut(text, 5, 6) == (Mark("f", "target"),)
    assert s.tokens(0, 2) == (0,) and s.tokens(2, 5) == (1, 2, 3) and s.tokens(5, 7) == (4,)


@pytest.fixture(scope="module")
def server():
    return shared(api_key="sesame")


@pytest.fixture(scope="module")
def expected(server):
    """The greedy answer, whole, as the API gives it."""
    r = server.client.chat.completions.create(model="x", messages=[{"role": "user", "content": REPEAT}],
                                              max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].message.content
    return r.choices[0].message.content


@pytest.mark.real
def test_streamed_chunks_say_where_each_piece_came_from_and_openai_parses_them(server, expected):
    stream = server.client.chat.completions.create(model="x", messages=[{"role": "user", "content": REPEAT}],
                                                   max_tokens=MAX_TOKENS, temperature=0, stream=True)
    content, marked, sources, taus = "", "", set(), []
    for chunk in stream:
        extra = chunk.model_extra.get("specgen")
        if chunk.choices and chunk.choices[0].delta.content:
            content += chunk.choices[0].delta.content
            assert extra is not None, chunk
            marked += "".join(text for text, _ in extra["sources"])
            sources |= {source for _, source in extra["sources"]}
            assert extra["tokens"] >= 1 and extra["tokens_per_s"] >= 0
            taus.append(extra["mean_accepted"])
    assert content == marked == expected
    assert "target" in sources and sources & DRAFTED, sources
    assert max(taus) > 1.0  # lookup accepted several tokens in a step


@pytest.mark.real
def test_the_page_is_served_at_the_root_and_other_paths_stay_json(server):
    with urllib.request.urlopen(server.url + "/", timeout=30) as r:  # no key needed: the page asks for it
        assert r.headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
        page = r.read().decode()
    assert "v1/chat/completions" in page and "http://" not in page and "https://" not in page  # nothing from elsewhere
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/nothing-here", timeout=30)
    assert e.value.code == 404 and "error" in json.loads(e.value.read())


def chrome():
    """Headless chromium over chromedriver, both Debian's (the Makefile's test set-up installs them)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver, "chromium and chromium-driver are missing: `make test` installs them (apt-get)"
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1000,720", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


@pytest.fixture(scope="module")
def browser():
    b = chrome()
    yield b
    b.quit()


def ask(browser, server, text, max_tokens):
    """Load the page, give it the key and a limit, send `text`; the reply's element."""
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    find = browser.find_element
    key, tokens = find(By.ID, "key"), find(By.ID, "max-tokens")
    key.clear()
    key.send_keys("sesame")
    tokens.clear()
    tokens.send_keys(str(max_tokens))
    find(By.ID, "prompt").send_keys(text)
    find(By.ID, "send").click()
    return find(By.CSS_SELECTOR, ".msg.assistant")


@pytest.mark.real
def test_the_page_streams_the_answer_and_marks_each_tokens_source_in_a_browser(server, expected, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    reply = ask(browser, server, REPEAT, MAX_TOKENS)
    WebDriverWait(browser, 120).until(lambda b: reply.get_attribute("data-state") != "streaming")
    stats = reply.find_element(By.CLASS_NAME, "stats").text
    assert reply.get_attribute("data-state") == "done", stats
    shown = reply.find_element(By.CLASS_NAME, "text").get_attribute("textContent")
    assert shown == expected
    marks = reply.find_elements(By.CSS_SELECTOR, ".tok[data-source]")
    sources = {m.get_attribute("data-source") for m in marks}
    assert "target" in sources and sources & DRAFTED, sources
    assert "".join(m.get_attribute("textContent") for m in marks) == expected
    find = browser.find_element
    assert float(find(By.ID, "tau").text) > 1.0 and float(find(By.ID, "tps").text) > 0
    assert "τ" in stats and "tok/s" in stats
    WebDriverWait(browser, 30).until(lambda b: "smollm2" in b.find_element(By.ID, "model").text)
    shot = tmp_path / SHOT.name
    assert browser.save_screenshot(str(shot)) and shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("SPECGEN_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SHOT)


@pytest.mark.real
def test_stop_ends_the_answer_and_the_generation(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    reply = ask(browser, server, "Write a long story about a lighthouse keeper.", 2000)
    WebDriverWait(browser, 120).until(lambda b: reply.find_elements(By.CSS_SELECTOR, ".tok"))
    browser.find_element(By.ID, "stop").click()
    WebDriverWait(browser, 30).until(lambda b: reply.get_attribute("data-state") != "streaming")
    assert reply.get_attribute("data-state") == "stopped"
    assert browser.find_element(By.ID, "send").is_enabled()
    WebDriverWait(browser, 60, poll_frequency=0.2).until(lambda b: idle(server))  # the server stopped too
    shown = reply.find_element(By.CLASS_NAME, "text").get_attribute("textContent")
    assert 0 < len(shown) and metric(server, "llamacpp:tokens_predicted_total") < 2000


def metric(server, name):
    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": "Bearer sesame"})
    with urllib.request.urlopen(req, timeout=30) as r:
        lines = r.read().decode().splitlines()
    return float(next(line.split()[1] for line in lines if line.startswith(name + " ")))


def idle(server):
    return metric(server, "llamacpp:requests_processing") == 0


@pytest.mark.real
def test_llama_servers_stream_carries_the_token_ids_of_each_piece(server):
    body = {"prompt": "a b c a b c a b c a b c", "n_predict": 16, "temperature": 0, "stream": True}
    req = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer sesame"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lines = [json.loads(e[len("data: "):]) for e in r.read().decode().split("\n\n") if e.startswith("data: ")]
    pieces = [line for line in lines if not line["stop"]]
    assert pieces and all(p["tokens"] for p in pieces)
    ids = [t for p in pieces for t in p["tokens"]]
    assert len(ids) == lines[-1]["tokens_predicted"] == 16
    detok = urllib.request.Request(server.url + "/detokenize", data=json.dumps({"tokens": ids}).encode(),
                                   method="POST", headers={"Authorization": "Bearer sesame"})
    with urllib.request.urlopen(detok, timeout=30) as r:
        assert json.loads(r.read())["content"] == "".join(p["content"] for p in pieces)
    assert {s for p in pieces for _, s in p["specgen"]["sources"]} & DRAFTED  # lookup drafts the repeats
