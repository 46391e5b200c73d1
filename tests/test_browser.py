"""A real browser: JupyterLab and Voila serve the notebooks, headless Chromium (Debian's, driven by the
``playwright`` package through ``executable_path``; never ``playwright install``) runs them and checks
that the widgets and figures render and react, and that the console stays free of errors.

JupyterLab runs on a copy of ``notebooks/`` in a temp dir (it autosaves executed notebooks), on a free
loopback port with a token. Every notebook runs, one after another, each in a page of its own; in every plotly
figure they draw (their own and their widgets') the text boxes are measured, and two labels drawn over
each other, or one cut off by the figure's edge, fail the test by notebook, figure and text (the geometry is
``tests/_figure_labels.py``, tested without a browser in ``tests/test_figure_labels.py``). The figures are
measured again after every interaction a test performs (a widget redraws its figures in place, with layouts
of its own: one profile picked, a step replayed), not only as first drawn. No green tick may
stand beside a False anywhere. Screenshots go to ``tests/screenshots/`` (git-ignored). Where Chromium is
missing and the user is root, it is installed from Debian's packages first, as in CI; otherwise the
module is skipped with one line saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _figure_labels as labels  # beside this file (tests/ is on sys.path under pytest's default import mode)
import _notebook_claims as claims
import pytest

pytestmark = [pytest.mark.notebook, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "tests" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# console messages that are not errors of ours: JupyterLab probing optional server endpoints
LOCAL = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")
# the notebook panel on show (a restored workspace may hold other, hidden ones)
NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
BENIGN_CONSOLE = ("Failed to load resource: the server responded with a status of 404",)
VIEWPORT = {"width": 1400, "height": 1000}
# every notebook, 06 and on included once they exist
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
# notebooks that must draw at least one plotly figure (every one: 03 draws each zoo case's evidence)
HAS_FIGURES = set(NOTEBOOKS)
RUN_TIMEOUT_MS = 300_000  # a notebook's run-all (the kernel checks of 04 in the Triton interpreter run longest)


def _have_chromium() -> str | None:
    """Path of Chromium, installing Debian's package where missing and allowed (root with apt-get)."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            if subprocess.run(cmd, capture_output=True, env=env, timeout=900).returncode != 0:
                return None
    return CHROMIUM if os.path.exists(CHROMIUM) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"no answer from {url} within {timeout} s")


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("jupyterlab", reason="jupyterlab (the lab extra) is not installed")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
    path = _have_chromium()
    if path is None:
        pytest.skip("Chromium not available: apt-get install -y chromium (as root) to run the browser test")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def _server_env(tmp: Path) -> dict[str, str]:
    settings = tmp / "settings"
    # no first-start "Jupyter news" toast over the screenshots, and no network fetch for it
    note = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # every cell rendered, not only those in view: the figures of a whole notebook are measured at once
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    return dict(
        os.environ,
        TRITON_INTERPRET="1",
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
    )


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """JupyterLab on a copy of notebooks/; yields its base URL and its token."""
    tmp = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", tmp / "notebooks")
    port, token = _free_port(), os.urandom(16).hex()
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={tmp / 'notebooks'}",
        "--LabApp.expose_app_in_browser=True",
        "--ServerApp.port_retries=0",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "lab.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_server_env(tmp), cwd=tmp)
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        yield f"http://127.0.0.1:{port}", token
    finally:
        _stop(proc)
        log.close()


class Console:
    """Collects the page's console errors and uncaught exceptions, and every request that leaves the
    machine (answered with an empty body here, so that nothing depends on the network)."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        self.external: list[str] = []
        page.route(lambda url: not url.startswith(LOCAL), self._route)  # only what leaves the machine
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} ({r.failure})"))

    def _route(self, route) -> None:
        url = route.request.url
        self.external.append(url)
        route.fulfill(status=200, body="", content_type="text/css" if ".css" in url else "text/plain")

    def _console(self, msg) -> None:
        if msg.type == "error" and not msg.text.startswith(BENIGN_CONSOLE):
            self.errors.append(msg.text)


# Resolves once the kernel of the notebook in the page has answered its kernel_info request, true when it is
# then connected (its status may still read "unknown": no status message yet); false when there is no kernel
# or no answer within 20 s.
KERNEL_READY_JS = """
async () => {
  const ready = async () => {
    const ctx = window.jupyterapp.shell.currentWidget && window.jupyterapp.shell.currentWidget.sessionContext;
    if (!ctx) return false;
    await ctx.ready;
    const kernel = ctx.session && ctx.session.kernel;
    if (!kernel) return false;
    await kernel.info;
    return kernel.connectionStatus === 'connected';
  };
  return Promise.race([ready(), new Promise((resolve) => setTimeout(() => resolve(false), 20000))]);
}
"""


def _send_run_all(page, name: str) -> None:
    """Send run-all to the notebook open in ``page`` once its kernel is up, without waiting for the cells.

    The execution indicator says idle before the kernel really is ready, and a run-all sent then is
    dropped: wait until the kernel answered its kernel_info request (else a moment), send it without
    awaiting its promise, and resend until a prompt moves."""
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    for _attempt in range(4):
        ready = _attempt == 0 and page.evaluate(KERNEL_READY_JS)
        if not ready:
            page.wait_for_timeout(2_000)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        try:
            page.wait_for_function(
                "(nb) => [...document.querySelectorAll(nb + ' .jp-CodeCell .jp-InputPrompt')]"
                ".some(p => !['[ ]:', ''].includes(p.textContent.trim()))",
                arg=NB,
                timeout=8_000,
            )
            return
        except Exception:
            continue
    raise AssertionError(f"{name}: run-all never started")


def _wait_ran(page, name: str, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
    """Wait until every code cell of the notebook in ``page`` has run, or until it stopped at an error (run-all
    stops there: fail at once, with the error, rather than at the timeout)."""
    try:
        page.wait_for_function(
            "(nb) => { const ps = [...document.querySelectorAll(nb + ' .jp-CodeCell .jp-InputPrompt')]"
            ".map(p => p.textContent.trim());"
            " const all = ps.length > 0 && ps.every(p => /\\[\\d+\\]/.test(p));"
            " const stopped = !ps.includes('[*]:') &&"
            " !!document.querySelector(nb + \" [data-mime-type='application/vnd.jupyter.error']\");"
            " return all || stopped; }",
            arg=NB,
            timeout=timeout_ms,
        )
    except Exception:
        page.screenshot(path=str(SHOTS / f"{Path(name).stem}-timeout.png"))
        prompts = page.eval_on_selector_all(NB + " .jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent)")
        raise AssertionError(
            f"{name}: cells did not all run within {timeout_ms // 1000} s; prompts {prompts}"
        ) from None
    errors = _error_outputs(page)
    assert not errors, f"{name}: a cell failed:\n" + "\n".join(e[-2000:] for e in errors)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)


STREAMS = ("application/vnd.jupyter.stdout", "application/vnd.jupyter.stderr")  # a cell's printed output


def _printed(page) -> str:
    """The text the notebook in ``page`` printed (its cells' stdout and stderr outputs, in order), as
    ``test_notebooks.py`` reads it from the executed file."""
    texts = page.eval_on_selector_all(
        ", ".join(f"{NB} [data-mime-type='{m}']" for m in STREAMS), "els => els.map(e => e.textContent)"
    )
    return "".join(texts)


def _error_outputs(page) -> list[str]:
    mimes = ("application/vnd.jupyter.error", STREAMS[1])  # an error, or anything on stderr
    errs = page.eval_on_selector_all(
        ", ".join(f"{NB} [data-mime-type='{m}']" for m in mimes), "els => els.map(e => e.textContent)"
    )
    # tqdm progress bars write to stderr; they are not errors
    return [e for e in errs if "it/s]" not in e and "s/it]" not in e and "%|" not in e]


@dataclass
class Opened:
    """A notebook open in its own page, its run-all sent. ``failure``: why it did not start or run."""

    name: str
    page: Any
    console: Console
    failure: str | None = None
    ran: bool = False
    opened_at: float = field(default_factory=time.monotonic)
    seconds: float = 0.0  # from opening the page to every cell run (the kernel's start included)


class Notebooks:
    """The notebooks a test session needs, each open in a page of its own, run by the ``notebooks`` fixture one
    after another; a notebook no selected test named is opened when a test first asks for it."""

    def __init__(self, browser, base: str, token: str) -> None:
        self.browser, self.base, self.token = browser, base, token
        self.opened: dict[str, Opened] = {}

    def start(self, name: str) -> Opened:
        if name in self.opened:
            return self.opened[name]
        page = self.browser.new_page(viewport=VIEWPORT)
        nb = self.opened[name] = Opened(name, page, Console(page))
        try:
            page.goto(f"{self.base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={self.token}")
            _send_run_all(page, name)
        except Exception as e:  # this notebook's tests fail with the reason; the others go on
            nb.failure = f"{name}: {e}"
        return nb

    def run(self, name: str) -> Opened:
        """Open notebook ``name`` (if not yet) and wait until all its cells ran; a failure is kept, not raised."""
        nb = self.start(name)
        if nb.failure is None and not nb.ran:
            try:
                _wait_ran(nb.page, name)
                nb.ran, nb.seconds = True, time.monotonic() - nb.opened_at
            except AssertionError as e:
                nb.failure = str(e)
        return nb

    def ran(self, name: str) -> Opened:
        """The page of notebook ``name`` once all its cells ran (the first call waits); fails with the reason."""
        if name not in NOTEBOOKS:
            pytest.fail(f"{name} is not in notebooks/")
        nb = self.run(name)
        if nb.failure is not None:
            pytest.fail(nb.failure, pytrace=False)
        return nb

    def close(self) -> None:
        for nb in self.opened.values():
            nb.page.close()


def _uses(name: str):
    """Marks a test as one that drives notebook ``name`` (the ``notebooks`` fixture starts it up front)."""

    def mark(fn):
        fn.notebook = name
        return fn

    return mark


@pytest.fixture(scope="module")
def notebooks(request, browser, lab_server) -> Iterator[Notebooks]:
    """Runs every notebook the selected tests of this module drive, one after another, each in its own page
    (kept open for the tests). Not all at once: with 8 kernels busy on 2 cores the browser is starved for
    seconds, and a plotly FigureWidget's module (5 MB, one per widget) then misses anywidget's 2 s to
    initialise, or its view is drawn before its figure arrives (``workbench/widgets/figure_sync.py``)."""
    here = request.module.__name__
    wanted = set()
    for item in request.session.items:
        if getattr(getattr(item, "module", None), "__name__", None) != here:
            continue
        params = getattr(item, "callspec", None)
        wanted |= {params.params["name"]} if params and "name" in params.params else set()
        wanted |= {getattr(item.function, "notebook", None)} - {None}
    started = Notebooks(browser, *lab_server)
    for name in sorted(wanted):
        started.run(name)
    yield started
    started.close()


# a figure that has not drawn its data: no traces, axes on show, no title (a placeholder the workbench draws
# on purpose has a title, or hides its axes)
UNFILLED_JS = (
    "(root) => [...document.querySelectorAll(root + ' .js-plotly-plot')].map((g, i) => [g, i])"
    ".filter(([g]) => !g._fullLayout || !g.querySelector('svg.main-svg') || (!(g.data && g.data.length)"
    " && (g._fullLayout.xaxis || {}).visible && !(((g.layout || {}).title || {}).text))).map(([, i]) => i)"
)


def _settled(page, root: str = NB, timeout_s: float = 90.0) -> list[int]:
    """Wait until every plotly figure under ``root`` has drawn its data (and their number stays put a
    moment): a FigureWidget draws once its 5 MB module loaded, a responsive figure after its first resize.
    Returns the indices of figures still without their data at the timeout."""
    count = f"(root) => {{ const bad = ({UNFILLED_JS})(root); return bad.length ? -1 :"
    count += " document.querySelectorAll(root + ' .js-plotly-plot').length; }"
    last, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = page.evaluate(count, root)
        if n >= 0 and n == last:
            break
        last = n
        page.wait_for_timeout(400)
    page.mouse.move(1, 1)  # no hover label on a figure
    page.wait_for_timeout(300)
    return page.evaluate(UNFILLED_JS, root)


def _shoot(page, root: str, what: str, indices: list[int], why: str) -> None:
    """Screenshots of the figures ``indices`` under ``root`` to ``tests/screenshots/``."""
    plots = page.locator(f"{root} .js-plotly-plot")
    stem = re.sub(r"[^\w.-]+", "_", what)
    for i in indices:
        plots.nth(i).scroll_into_view_if_needed()
        plots.nth(i).screenshot(path=str(SHOTS / f"{stem}-figure{i + 1}-{why}.png"))


def _check_labels(page, what: str, root: str = NB) -> list[dict[str, Any]]:
    """Measure every figure under ``root`` and fail, naming ``what`` (the notebook), the figure and the two
    texts, on any labels drawn over each other or cut off by the figure's edge, or on a figure that never drew
    its data (a FigureWidget whose edits never reached its view); screenshots of the figures at fault go to
    ``tests/screenshots/``."""
    unfilled = _settled(page, root)
    _shoot(page, root, what, unfilled, "empty")
    assert not unfilled, f"{what}: figure(s) {[i + 1 for i in unfilled]} never drew their data"
    figures = page.evaluate(labels.COLLECT_JS, root)
    problems = labels.figure_problems(figures)
    _shoot(page, root, what, [f["index"] for f in figures if labels.figure_problems([f])], "labels")
    assert not problems, f"{what}: labels drawn over each other or cut off:\n  " + "\n  ".join(problems)
    return figures


# Runs in the page: the lines where a tick stands beside "False" (a green tick on a failed fact). A tick's
# line is the text of its nearest non-inline element (a table cell: its whole row), split at line breaks.
TICK_BESIDE_FALSE_JS = r"""
(root) => {
  const tick = /[\u2713\u2714]/;
  const out = new Set();
  const top = document.querySelector(root) || document.body;
  const walker = document.createTreeWalker(top, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!tick.test(n.nodeValue)) continue;
    let el = n.parentElement;
    while (el && el !== top && getComputedStyle(el).display.startsWith('inline')) el = el.parentElement;
    if (el && el.closest('td, th')) el = el.closest('tr');
    for (const line of ((el && el.innerText) || n.nodeValue).split('\n'))
      if (tick.test(line) && /\bFalse\b/.test(line)) out.add(line.trim());
  }
  return [...out];
}
"""


def _no_tick_beside_false(page, what: str, root: str = NB) -> None:
    lines = page.evaluate(TICK_BESIDE_FALSE_JS, root)
    assert not lines, f"{what}: a tick beside False: {lines}"


def _clean_console(nb: Opened) -> None:
    assert not nb.console.errors, nb.console.errors
    assert not nb.console.external, nb.console.external


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_no_figure_draws_a_label_over_another(notebooks, name, request):
    """Every notebook runs in the lab without an error output, within its time limit, and prints what it
    demonstrates (``tests/_notebook_claims.py``: then ``test_notebooks.py`` does not run it again); in every
    figure it draws (its own and its widgets'), no two labels cover each other and none is cut off; no tick
    stands beside a False."""
    nb = notebooks.ran(name)
    limit = claims.time_limit(name)
    assert nb.seconds < limit, f"{name} took {nb.seconds:.0f} s in the lab, over its limit of {limit} s"
    missing = claims.missing_lines(name, _printed(nb.page))
    assert not missing, f"{name} did not print {missing}"
    figures = _check_labels(nb.page, name)
    if name in HAS_FIGURES:
        assert figures, f"{name}: no plotly figure rendered"
    _no_tick_beside_false(nb.page, name)
    _clean_console(nb)
    claims.checked_in_browser(request.config).add(name)


def _padding_bars(page, plot_index: int = 0) -> list[int]:
    """Cells per trace of the padding map (the first plotly figure of the explorer), read from the page."""
    return page.evaluate(
        "(i) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];"
        " return gd.data.map(t => (t.base || []).length); }",
        plot_index,
    )


@_uses("00_quickstart.ipynb")
def test_quickstart_renders_and_the_slider_moves_the_bars(notebooks):
    nb = notebooks.ran("00_quickstart.ipynb")
    page = nb.page
    page.wait_for_selector(".jupyter-widgets .widget-slider", timeout=60_000)
    page.wait_for_selector(".jupyter-widgets .js-plotly-plot", timeout=60_000)
    # the explorer's padding map is the first plotly figure inside a widget
    plots = page.locator(".jupyter-widgets .js-plotly-plot")
    idx = page.evaluate(
        "() => [...document.querySelectorAll('.js-plotly-plot')].findIndex(e => e.closest('.jupyter-widgets'))"
    )
    _settled(page, ".jupyter-widgets")  # the FigureWidget's traces arrive once its model synced
    before = _padding_bars(page, idx)
    assert before == [15, 6, 3]  # 5 live rows x 3 profiles; 3 padded rows skipped x 2, processed x 1
    slider = page.locator(".widget-slider:has(.widget-label:text-is('raw batch size')) .noUi-handle").first
    slider.scroll_into_view_if_needed()
    slider.focus()
    slider.press("ArrowRight")
    page.wait_for_function(
        "(i) => document.querySelectorAll('.js-plotly-plot')[i].data[0].base.length === 18", arg=idx, timeout=60_000
    )
    after = _padding_bars(page, idx)
    assert after == [18, 4, 2] and after != before  # 6 live rows: bucket 8 keeps 2 padded rows each
    _check_labels(page, "00_quickstart.ipynb after the slider moved")
    plots.nth(0).scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "00_quickstart_explorer.png"))
    _clean_console(nb)


# the explorer's padding map (the first plotly figure inside a widget): its steps, top first, as the page has them
_EXPLORER_STEPS_JS = (
    "() => { const gd = [...document.querySelectorAll('.js-plotly-plot')].find(e => e.closest('.jupyter-widgets'));"
    " return gd && gd.layout.yaxis && gd.layout.yaxis.categoryarray ? [...gd.layout.yaxis.categoryarray] : null; }"
)


def _explorer_select(page, label: str, value: str, profiles: tuple[str, ...], mode: str) -> None:
    """Choose ``value`` in the explorer's dropdown ``label``; wait until its padding map shows one step of
    ``mode`` per profile of ``profiles`` (the kernel answered and the figure was redrawn)."""
    page.locator(f".widget-dropdown:has(> .widget-label:text-is('{label}')) select").first.select_option(value)
    want = sorted(f"{p} {mode} " for p in profiles)
    page.wait_for_function(
        f"(want) => {{ const s = ({_EXPLORER_STEPS_JS})(); return !!s && s.length === want.length &&"
        " [...s].sort().every((x, i) => x.startsWith(want[i])); }",
        arg=want,
        timeout=60_000,
    )


@_uses("00_quickstart.ipynb")
def test_explorer_keeps_its_labels_apart_after_every_profile_and_mode_chosen(notebooks):
    """Each profile alone and all three, in each mode: after every choice the explorer's figures (redrawn in
    place, not built anew) are measured again, not only as first drawn."""
    name = "00_quickstart.ipynb"
    nb = notebooks.ran(name)
    page = nb.page
    page.wait_for_selector(".jupyter-widgets .js-plotly-plot", timeout=60_000)
    _settled(page, ".jupyter-widgets")
    all_three = ("sglang", "sglang-ascend", "vllm")
    for profile in (*all_three, "all"):
        shown = all_three if profile == "all" else (profile,)
        _explorer_select(page, "profile", profile, shown, "decode")
        _check_labels(page, f"{name} after the explorer's profile {profile!r} was chosen")
    _explorer_select(page, "profile", "sglang", ("sglang",), "decode")
    for mode in ("target_verify", "extend", "idle", "decode"):
        _explorer_select(page, "mode", mode, ("sglang",), mode)
        _check_labels(page, f"{name} after the explorer's mode {mode!r} (profile 'sglang') was chosen")
    _explorer_select(page, "profile", "all", all_three, "decode")  # as the notebook left it
    _clean_console(nb)


def _lab_control(lab, label: str, kind: str = "input"):
    """The ``input`` or ``select`` of the lab's control described ``label``."""
    return lab.locator(f".widget-inline-hbox:has(> .widget-label:text-is('{label}')) {kind}").first


def _lab_step(page, lab, *, batch_size: int, mode: str, wait_for: str) -> str:
    """Set the batch size and mode, press Replay, wait for the step's "how it ran" line to say ``wait_for``;
    returns the lab's whole text."""
    _lab_control(lab, "mode", "select").select_option(mode)
    size = _lab_control(lab, "batch size")
    size.fill(str(batch_size))
    size.press("Enter")
    button = lab.locator("button:has-text('Replay')").first
    page.wait_for_function("(b) => !b.disabled", arg=button.element_handle(), timeout=60_000)
    button.click()
    lab.locator(f".wb-verdict[data-key='how']:has-text('{wait_for}')").first.wait_for(timeout=120_000)
    return _steady_text(lab)


def _steady_text(lab, timeout_s: float = 30.0) -> str:
    """The lab's text once it stopped changing: the view updates its result, timing, accept line and ops table
    as separate widget messages, so the verdict can arrive before the ops table it goes with."""
    text, deadline = lab.inner_text(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = lab.inner_text()
        if again == text:
            return text
        text = again
    return text


def _lab_capture(page, lab) -> None:
    lab.locator("button:has-text('Capture')").first.click()
    lab.locator(".wb-verdict[data-key='capture']:has-text('captured 8 graphs')").first.wait_for(timeout=120_000)


def _lab_accept(page, lab) -> str:
    """Verify + accept after a verify step; returns the accept line, which must be a passed check."""
    button = lab.locator("button:has-text('Verify + accept')").first
    page.wait_for_function("(b) => !b.disabled", arg=button.element_handle(), timeout=60_000)
    button.click()
    line = lab.locator(".wb-accept").first
    line.wait_for(timeout=120_000)
    text = line.inner_text()
    assert line.get_attribute("data-ok") == "true" and "holds its accepted state: True" in text, text
    return text


REPLAY_TIME = re.compile(r"\breplay\s+[\d.]+\s*(us|ms|s)\b")


@_uses("01_capture_and_replay.ipynb")
def test_capture_then_replay_shows_a_clean_integrity_result(notebooks):
    """The lab captures, replays a batch in its bucket (clean, bitwise equal on the CPU recorder), runs a batch
    above the largest bucket eagerly and says so (no replay claim, no replay time), and accepts a verify
    step correctly under sglang and vLLM; no tick ever stands beside a False."""
    name = "01_capture_and_replay.ipynb"
    nb = notebooks.ran(name)
    page = nb.page
    page.wait_for_selector(".jupyter-widgets .js-plotly-plot", timeout=60_000)
    lab = page.locator(".widget-vbox", has=page.locator(".widget-html-content b", has_text="Capture and replay lab"))
    lab = lab.first
    lab.scroll_into_view_if_needed()
    _lab_capture(page, lab)
    _check_labels(page, f"{name} after Capture")  # after every action, not only as first drawn
    text = _lab_step(page, lab, batch_size=3, mode="decode", wait_for="replay == eager bitwise")
    assert "decode bs=3 -> 4: replay == eager bitwise: True" in text, text
    _check_labels(page, f"{name} after a decode step")
    integrity = lab.locator(".wb-integrity").first
    assert integrity.get_attribute("data-ok") == "true" and "integrity: clean" in integrity.inner_text()
    assert REPLAY_TIME.search(text), text  # a replayed step is timed both ways

    # above the largest bucket (8): eager, and nothing that claims a replay
    text = _lab_step(page, lab, batch_size=12, mode="decode", wait_for="no graph ran")
    how = lab.locator(".wb-verdict[data-key='how']").first.inner_text()
    assert "eager" in how and "above the largest bucket 8" in how, how
    for claim in ("replay == eager bitwise", "does not list its ops"):
        assert claim not in text, f"an eager step shows {claim!r}:\n{text}"
    assert not REPLAY_TIME.search(text), f"an eager step shows a replay time:\n{text}"
    assert "integrity: clean" in lab.locator(".wb-integrity").first.inner_text()
    assert "ran eagerly" in text  # the ops table says why it is empty
    _no_tick_beside_false(page, f"{name} (eager step)")
    _check_labels(page, f"{name} after an eager step")
    page.screenshot(path=str(SHOTS / "01_capture_replay_lab_eager.png"))

    # verify + accept, under sglang (the accepted step copied back) and vLLM (one slot per draft position)
    _lab_step(page, lab, batch_size=3, mode="target_verify", wait_for="target_verify bs=3")
    _check_labels(page, f"{name} after a target_verify step")
    _lab_accept(page, lab)
    _no_tick_beside_false(page, f"{name} (sglang accept)")
    _check_labels(page, f"{name} after Verify + accept")
    _lab_control(lab, "profile", "select").select_option("vllm")
    _lab_capture(page, lab)
    _check_labels(page, f"{name} after Capture under vllm")
    _lab_step(page, lab, batch_size=3, mode="target_verify", wait_for="target_verify bs=3")
    accepted = _lab_accept(page, lab)
    assert "vllm keeps one slot per draft position" in accepted, accepted
    _no_tick_beside_false(page, f"{name} (vllm accept)")
    _check_labels(page, f"{name} after the lab's steps")
    lab.locator(".wb-integrity").first.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "01_capture_replay_lab.png"))
    _clean_console(nb)


@_uses("03_bug_zoo.ipynb")
def test_bug_zoo_widget_runs_a_case_and_checks_the_backend_typed_in(notebooks):
    nb = notebooks.ran("03_bug_zoo.ipynb")
    page = nb.page
    zoo = page.locator(".widget-vbox", has=page.locator(".widget-html-content b", has_text="Bug zoo")).first
    zoo.wait_for(timeout=60_000)
    zoo.scroll_into_view_if_needed()
    cases = zoo.locator(".widget-dropdown select option")
    assert cases.count() >= 8, cases.all_inner_texts()  # every case of the zoo to pick from
    assert zoo.locator("button:has-text('Run unfixed + fixed')").count() == 1
    zoo.locator("button:has-text('Run unfixed + fixed')").click()
    zoo.locator(".wb-zoo[data-broken='true']").first.wait_for(timeout=120_000)  # the bug as it shipped
    zoo.locator(".wb-zoo[data-broken='false']").first.wait_for(timeout=60_000)  # and with its fix
    # the evidence drawn, broken beside fixed, with room for its labels
    zoo.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
    assert _check_labels(page, "03_bug_zoo.ipynb (BugZoo after Run)"), "the zoo widget drew no figure"
    backend_box = zoo.locator(".widget-text:has(.widget-label:text-is('your backend')) input").first
    backend_box.scroll_into_view_if_needed()
    backend_box.fill(f"{ROOT / 'tests' / 'fixtures' / 'user_backends' / 'in_capture_bug.py'}:AscendBackend")
    zoo.locator("button:has-text('Check my backend')").click()
    page.wait_for_selector(".wb-zoo-checks[data-ok='false']", timeout=120_000)
    table = page.locator(".wb-zoo-checks").last
    text = table.inner_text()
    assert "in_capture" in text and "sglang PR 29598" in text and "reproduced" in text
    _no_tick_beside_false(page, "03_bug_zoo.ipynb (BugZoo)")
    table.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "03_bug_zoo_your_backend.png"))
    _clean_console(nb)


@_uses("05_timings.ipynb")
def test_timing_dashboard_draws_its_sweep_and_roofline_with_room_for_their_labels(notebooks):
    """The dashboard's figures as its buttons redraw them (latency of a sweep, the roofline of the ceilings
    and kernels) at the widget's width: no label over another."""
    name = "05_timings.ipynb"
    nb = notebooks.ran(name)
    page = nb.page
    board = page.locator(".widget-vbox", has=page.locator(".widget-html-content b", has_text="Timing dashboard")).first
    board.wait_for(timeout=60_000)
    board.scroll_into_view_if_needed()
    board.locator("button:has-text('Sweep')").first.click()
    board.locator("text=/\\d+ records: gdn step/").first.wait_for(timeout=120_000)
    _check_labels(page, f"{name} after Sweep")
    board.locator("button:has-text('Ceilings + kernels')").first.click()
    board.locator("text=/ceilings on cpu: .* kernel records/").first.wait_for(timeout=180_000)
    _check_labels(page, f"{name} after Sweep and Ceilings + kernels")
    _no_tick_beside_false(page, f"{name} (dashboard)")
    board.locator(".js-plotly-plot").nth(1).scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "05_timings_dashboard.png"))
    _clean_console(nb)


@pytest.fixture(scope="module")
def voila_server(tmp_path_factory) -> Iterator[str]:
    pytest.importorskip("voila", reason="voila (the lab extra) is not installed")
    tmp = tmp_path_factory.mktemp("voila")
    port, token = _free_port(), os.urandom(16).hex()
    cmd = [
        sys.executable,
        "-m",
        "voila",
        str(ROOT / "app" / "metadata_explorer.ipynb"),
        "--no-browser",
        f"--port={port}",
        "--Voila.ip=127.0.0.1",
        f"--token={token}",
    ]
    log = open(tmp / "voila.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_server_env(tmp), cwd=tmp)
    try:
        _wait_port(port, proc)  # voila's page itself runs the notebook: ask for it once, from the browser
        yield f"http://127.0.0.1:{port}/?token={token}"
    finally:
        _stop(proc)
        log.close()


def test_voila_app_serves_the_explorer(browser, voila_server):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console = Console(page)
    page.goto(voila_server)
    page.wait_for_selector(".jupyter-widgets .js-plotly-plot", timeout=120_000)
    page.wait_for_selector(".widget-slider", timeout=30_000)
    assert page.locator("text=Metadata explorer").count() >= 1
    # all three figures shown at the start (padding map, slot map, qsl staircase) drew their traces; the draft
    # tree's figure waits, hidden, for a target_verify step
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')]"
        ".filter(g => g.offsetParent !== null && g.data && g.data.length).length === 3",
        timeout=60_000,
    )
    _check_labels(page, "Voila's metadata explorer", root="body")
    page.screenshot(path=str(SHOTS / "voila_metadata_explorer.png"), full_page=True)
    # anywidget rejects a promise when a model takes over 2 s to start; Voila starts the three
    # FigureWidgets (each with plotly's bundle) at once, which a loaded 2-core machine can exceed. The
    # figures rendered (checked above), so that one message is tolerated here, and only here.
    errors = [e for e in console.errors if e != "pageerror: [anywidget] Failed to initialize model."]
    assert not errors, errors
    # Voila's lab template links Font Awesome from a CDN (its own bundle carries the same icons): the only
    # request that may leave the machine
    assert all("@fortawesome/fontawesome-free" in u for u in console.external), console.external
    page.close()


@_uses("06_serving_traces.ipynb")
def test_serving_timeline_draws_and_its_step_slider_moves_the_selection(notebooks):
    """The serving timeline's figure draws; ArrowRight on its step slider moves the selected step (the step
    line and the figure's outline follow it); no label over another before or after."""
    name = "06_serving_traces.ipynb"
    nb = notebooks.ran(name)
    page = nb.page
    view = page.locator(".widget-vbox", has=page.locator(".widget-html-content b", has_text="Serving timeline")).first
    view.wait_for(timeout=60_000)
    view.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    _settled(page, ".jupyter-widgets")
    _check_labels(page, f"{name} (timeline)")
    line = view.locator(".wb-timeline-step").first
    assert line.inner_text().startswith("step 0")
    outline = (
        "() => { const g = [...document.querySelectorAll('.widget-vbox .js-plotly-plot')].find("
        "e => (((e.layout || {}).title || {}).text || '').startsWith('Slot timeline'));"
        " return g && g.layout.shapes && g.layout.shapes.length ? g.layout.shapes[0].x0 : null; }"
    )
    assert page.evaluate(outline) == -0.5
    slider = view.locator(".widget-slider:has(.widget-label:text-is('step')) .noUi-handle").first
    slider.scroll_into_view_if_needed()
    slider.focus()
    slider.press("ArrowRight")
    slider.press("ArrowRight")
    # the kernel answers the slider once it is free: under the other notebooks' load, that can take a while
    view.locator(".wb-timeline-step", has_text=re.compile(r"^step 2\b")).first.wait_for(timeout=120_000)
    page.wait_for_function(f"() => ({outline})() === 1.5", timeout=60_000)
    _check_labels(page, f"{name} after the step slider moved")
    view.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "06_serving_timeline.png"))
    _clean_console(nb)


@_uses("07_prefix_caching.ipynb")
def test_prefix_cache_timelines_draw_checkpoints_and_copies(notebooks):
    """Notebook 07's timelines draw: the hand-written trace's checkpoint cells in green with the cache's copies
    as arrows, the over-reuse case's checkpoint in vermillion, the Mamba2 grid case's two checkpoints one green
    (on the grid) and one vermillion (read with per-request offsets); its step line names the cache's work; no
    label over another."""
    name = "07_prefix_caching.ipynb"
    nb = notebooks.ran(name)
    page = nb.page
    views = page.locator(".widget-vbox", has=page.locator(".widget-html-content b", has_text="Serving timeline"))
    views.nth(3).wait_for(timeout=120_000)  # the trace by hand, the workload, two zoo cases
    for i in range(4):
        views.nth(i).locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    _settled(page, ".jupyter-widgets")
    _check_labels(page, f"{name} (timelines)")
    figures = (
        "() => [...document.querySelectorAll('.widget-vbox .js-plotly-plot')]"
        ".filter(e => (((e.layout || {}).title || {}).text || '').startsWith('Slot timeline'))"
        ".map(e => ({arrows: (e.layout.annotations || []).length, z: e.data[0].z}))"
    )
    drawn = page.evaluate(figures)
    assert len(drawn) == 4, drawn
    green, vermillion = 3, 2  # CHECKPOINT and FOREIGN codes of workbench.viz.timeline
    by_hand, _, over_reuse, grid = drawn
    assert by_hand["arrows"] == 2 and any(green in line for line in by_hand["z"])
    assert any(vermillion in line for line in over_reuse["z"])
    assert grid["z"][4][0] == green and grid["z"][5][0] == vermillion  # slots 4 and 5 after step 0
    line = views.first.locator(".wb-timeline-step").first
    assert "prefix cache: copies 1 -> 5 after, publishes request 0's first 8 tokens in slot 5" in line.inner_text()
    views.first.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "07_prefix_timeline.png"))
    _clean_console(nb)
