"""The web console in a real browser: headless Chromium from the distribution's packages,
driven by Selenium. An approver logs in with their key's signature, finds the task waiting
for approval in the task list, approves it on its page and sees it SUCCEEDED. Screenshots
of the task page are saved (``$RATCHET_ARTIFACTS/console`` or the test's tmp dir; the
paths are printed)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen
from selenium.webdriver.support.ui import Select, WebDriverWait

import ratchet
from ratchet.protocol.auth import Signer
from ratchet.supervisors.console import Console, login_code
from tests.conftest import NodeFactory
from tests.console_helpers import start_console
from tests.graph_apps import app as graph_app
from tests.keys import grant

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="no chromium/chromedriver installed (apt-get install chromium"
                              " chromium-driver; .ci/run does)"),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1800"]


def _approve_in_browser(console: Console, signer: Signer, task_id: str, profile: Path,
                        shots: Path) -> list[Path]:
    """The user's side, in a thread (Selenium blocks): returns the screenshots taken."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                              options=options)
    taken = []
    try:
        # a page that reloads itself (the task's, while live) may swap an element found
        wait = WebDriverWait(driver, 30, ignored_exceptions=[StaleElementReferenceException])
        driver.get(console.url + "/tasks")  # not logged in: sent to the login page
        challenge = wait.until(seen.presence_of_element_located((By.ID, "challenge")))
        code = login_code(signer, challenge.get_attribute("value") or "", console.node_id)
        driver.find_element(By.ID, "code").send_keys(code)
        driver.find_element(By.ID, "login").click()
        Select(wait.until(seen.presence_of_element_located((By.ID, "f-status")))) \
            .select_by_value("WAITING_APPROVAL")
        driver.find_element(By.ID, "filter").click()
        wait.until(seen.url_contains("status=WAITING_APPROVAL"))  # the filtered list
        link = wait.until(seen.element_to_be_clickable((By.LINK_TEXT, task_id)))
        taken.append(shots / "task-list.png")
        driver.save_screenshot(str(taken[-1]))
        link.click()
        wait.until(seen.presence_of_element_located((By.CSS_SELECTOR, "svg.graph .current")))
        taken.append(shots / "task-waiting.png")
        driver.save_screenshot(str(taken[-1]))
        driver.find_element(By.ID, "approve").click()
        wait.until(seen.presence_of_element_located((By.ID, "flash")))
        # The page reloads itself while the task is live; it shows the end when it comes.
        wait.until(seen.text_to_be_present_in_element((By.CSS_SELECTOR, "h1 .status"),
                                                      "SUCCEEDED"))
        taken.append(shots / "task-succeeded.png")
        driver.save_screenshot(str(taken[-1]))
    finally:
        driver.quit()
    return taken


async def test_an_approver_approves_a_waiting_task_in_the_browser_and_sees_it_succeed(
    start_node: NodeFactory, client: ratchet.Client, tmp_path: Path
) -> None:
    node = await start_node(graph_app)
    console = await start_console(node)
    try:
        ann = await grant(node, "ann", "acme", ["approver"])
        task_id = (await client.submit("approve", {"amount": 70}, key="browser")).task_id
        async for event in client.watch(task_id):
            if event.type == "approval.requested":
                break
        shots = Path(os.environ.get("RATCHET_ARTIFACTS", tmp_path)) / "console"
        shots.mkdir(parents=True, exist_ok=True)
        taken = await asyncio.to_thread(_approve_in_browser, console, ann, task_id,
                                        tmp_path / "chromium-profile", shots)
        print("console screenshots:", *map(str, taken))
        assert all(p.stat().st_size > 0 for p in taken)
        rec = await node.store.load_task(task_id)  # type: ignore[union-attr]
        assert rec.status == "SUCCEEDED" and rec.output == {"paid": 70}
    finally:
        await console.stop()
