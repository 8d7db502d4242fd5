"""The HTML report as a reader sees it: a tiny notebook run by the runner, its report opened in headless Chromium
(driven over the DevTools protocol on the loopback address). Every page reachable from the index loads with every
image, every link resolves, MathJax typesets every $$ (served from the report folder: nothing is fetched from the
network) and a tqdm bar reads as text. Skipped only where no Chromium is installed, and never in CI (.ci/run
installs Debian's chromium; there a missing browser fails the test)."""
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from replication.run import runner

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
# Headless, offline: no background connections (this machine's network is closed), a fresh profile.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--remote-allow-origins=*"]
# What a page shows once loaded and typeset: images that did not load, links, raw TeX and typeset equations.
PAGE_STATE = """(() => {
const found = id => { try { return document.getElementById(id) || document.getElementById(decodeURIComponent(id)); }
                      catch (e) { return document.getElementById(id); } };  // a fragment matches raw or decoded
return JSON.stringify({
  ready: document.readyState === "complete" && (typeof MathJax === "undefined" ||
         (MathJax.isReady === true && MathJax.Hub.queue.pending === 0 && MathJax.Hub.queue.running === 0)),
  images: document.images.length,
  broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80)),
  links: [...document.querySelectorAll("a[href]")].map(a => a.href),
  anchors: [...document.querySelectorAll('a[href^="#"]')].map(a => a.getAttribute("href"))
           .filter(h => h.length > 1 && !found(h.slice(1))),
  raw_tex: document.body.innerText.includes("$$"),
  math: document.querySelectorAll(".MathJax_Display, .MathJax").length,
  math_errors: document.querySelectorAll(".MathJax_Error").length,
  text: document.body.innerText});
})()"""

MARKDOWN = r"""# 01 · A tiny notebook

The group advantage is $$A_i = \frac{r_i - \mathrm{mean}(r)}{\mathrm{std}(r) + 10^{-4}},$$ with inline $\beta = 0$.

## Part 1: a line"""


@pytest.fixture
def chromium():
    """The path of a Chromium; skipped where there is none, except in CI, where it is an error."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium ({', '.join(BROWSERS)}) in CI: .ci/run installs Debian's chromium")
        pytest.skip(f"no Chromium installed ({', '.join(BROWSERS)}); apt-get install chromium to run this test")
    return CHROMIUM


class Page:
    """One Chromium page driven over the DevTools protocol; records every request and every failed load."""

    def __init__(self, binary: str, profile_dir: Path):
        import websocket

        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        for line in self.proc.stderr:
            if "DevTools listening on ws://" in line:
                port = urlparse(line.split()[-1]).port
                break
        assert port, "Chromium did not start its DevTools endpoint"
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()  # drain its log
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=30).read())
        self.ws = websocket.create_connection(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"],
                                              timeout=60, suppress_origin=True)
        self.next_id, self.requests, self.failed = 0, {}, []
        self.call("Network.enable")
        self.call("Page.enable")

    def call(self, method: str, **params) -> dict:
        """Send one command and return its result, recording the network events that arrive meanwhile."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Network.requestWillBeSent":
                self.requests[msg["params"]["requestId"]] = msg["params"]["request"]["url"]
            elif msg.get("method") == "Network.loadingFailed":
                url = self.requests.get(msg["params"]["requestId"])
                if url != "about:blank":  # a font request Chromium makes from about:blank, not a file of the report
                    self.failed.append(f"{url}: {msg['params'].get('errorText')}")
            elif msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]

    def open(self, url: str, timeout: float = 60) -> dict:
        """Load a page and wait until it and MathJax are done; its PAGE_STATE."""
        self.call("Page.navigate", url=url)
        deadline = time.time() + timeout
        while True:
            time.sleep(0.5)
            state = json.loads(self.call("Runtime.evaluate", expression=PAGE_STATE)["result"]["value"])
            if state["ready"] or time.time() > deadline:
                return state

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def tiny_book(folder: Path) -> Path:
    """A notebook with TeX in Markdown, a tqdm bar, a figure and two claims."""
    nb = new_notebook()
    params = new_code_cell("profile = 'default'\nseed = 0\nn = 3")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [new_markdown_cell(MARKDOWN), params, new_code_cell(
        'from replication.run import workbook\nfrom replication.core.figures import savefig\nimport matplotlib.pyplot as plt\n'
        'from tqdm.auto import tqdm\nrun = workbook.start("01_first", profile=profile, seed=seed)\n'
        'for i in tqdm(range(n), desc="inner"):\n    pass\n'
        'plt.plot(range(n))\nsavefig("01a_line", "A line of $n$ points.")\n'
        'run.claim("a line has n points", "n", str(n), "arithmetic", "counted", holds=True)\n'
        'run.claim("a line has no points", "0", str(n), "simulation", "counted", holds=False)\nrun.finish()')]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir()
    nbformat.write(nb, folder / "01_first.ipynb")
    (folder / "params").mkdir()
    (folder / "params" / "01_first.json").write_text(json.dumps({"smoke": {}, "default": {}}))
    return folder


def test_report_in_headless_chromium(chromium, tmp_path, runs):
    runner.run("default", folder=tiny_book(tmp_path / "notebooks"), log=lambda *_: None)
    report = runs / "default" / "report"
    page = Page(chromium, tmp_path / "chromium-profile")
    try:
        seen, todo, states = set(), [report / "index.html"], {}
        while todo:  # the index and every report page it links to
            path = todo.pop()
            seen.add(path)
            states[path.name] = state = page.open(path.as_uri())
            assert state["ready"], f"{path.name}: MathJax or the page did not finish in time"
            assert not state["broken"], f"{path.name}: images that did not load: {state['broken']}"
            assert not state["anchors"], f"{path.name}: links to anchors that are not on the page: {state['anchors']}"
            for link in state["links"]:
                url = urlparse(link)
                assert url.scheme == "file", f"{path.name}: a link off the report folder: {link}"
                target = Path(unquote(url.path))
                assert target.is_file(), f"{path.name}: link to a missing file: {link}"
                if target.suffix == ".html" and target not in seen:
                    todo.append(target)
            assert not state["raw_tex"], f"{path.name}: raw $$ TeX left on the page"
            assert state["math_errors"] == 0, f"{path.name}: MathJax errors"
    finally:
        page.close()
    assert set(states) == {"index.html", "01_first.html"}
    index, notebook = states["index.html"], states["01_first.html"]
    assert index["images"] == 1 and "A line of" in index["text"]  # the figure as a thumbnail with its caption
    assert "1 reproduced" in index["text"] and "1 not reproduced" in index["text"] and "simulation" in index["text"]
    assert notebook["math"] >= 2 and notebook["images"] >= 1  # both equations typeset, the figure inline
    assert "inner: 100%" in notebook["text"] and "3/3" in notebook["text"]  # the tqdm bar as text
    assert not [u for u in page.requests.values() if not u.startswith(("file:", "data:", "about:"))], page.requests
    assert not page.failed, page.failed
    assert any("/mathjax/" in u for u in page.requests.values())  # MathJax came from the report folder
