"""The live explorer served by Voilà (``python -m fedlib explore``), driven in headless Chromium:
change the seed, press Run, and the accuracy curve and the contribution chart change."""

import os
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver")
                                                else None)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="Debian's chromium and chromium-driver are not installed")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from fedlib.app import explore  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Voilà on a free port, with its own result cache (the first view runs for real)."""
    if shutil.which("voila") is None and not os.path.exists(os.path.join(os.path.dirname(os.sys.executable), "voila")):
        pytest.skip("voila is not installed (pip install -e '.[book]')")
    cache = tmp_path_factory.mktemp("cache")
    env = {**os.environ, "FEDLIB_CACHE": str(cache), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(cache / "voila.log", "w")
    process, url = explore.start(env=env, stdout=log, stderr=subprocess.STDOUT)
    yield url
    process.terminate()
    process.wait(timeout=20)
    log.close()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--window-size=1400,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _figures(driver) -> list[str]:
    """The PNG sources of the explorer's figures (split, accuracy, contribution), read in one script
    so that a redraw between two element lookups cannot leave a stale reference."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.widget-output img')).map(img => img.src);")


def _status(driver) -> str:
    labels = driver.execute_script(
        "return Array.from(document.querySelectorAll('.widget-label')).map(label => label.innerText);")
    return " | ".join(labels)


def test_changing_the_seed_and_pressing_run_redraws_the_curves_and_contributions(served, browser):
    browser.get(served)
    wait = WebDriverWait(browser, 240, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: len(_figures(d)) == 3)  # the first view: the notebook's own Run
    split, accuracy, contribution = _figures(browser)
    assert all(src.startswith("data:image/png;base64,") for src in (split, accuracy, contribution))
    assert "Done in" in _status(browser)

    seed = browser.find_element(By.XPATH, "//div[contains(@class, 'widget-text')][.//label[text()='seed']]//input")
    seed.clear()
    seed.send_keys("7\t")  # a new seed: another split, other curves
    browser.find_element(By.XPATH, "//button[contains(., 'Run')]").click()
    wait.until(lambda d: len(_figures(d)) == 3 and _figures(d)[1] != accuracy)
    new_split, new_accuracy, new_contribution = _figures(browser)
    assert new_accuracy != accuracy and new_contribution != contribution and new_split != split
    wait.until(lambda d: "Done in" in _status(d))
    assert "Final test accuracy: fedavg" in _status(browser)


def test_its_pages_send_no_referrer(served):
    """Issue 43: ``Referrer-Policy: no-referrer`` on the pages Voilà serves (the login page, the redirect
    to it), so the token in the URL never travels in a Referer header to another site."""
    import http.client
    from urllib.parse import urlsplit

    port = urlsplit(served).port
    for path, status in (("/", 302), ("/login", 200)):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        assert (response.status, response.getheader("Referrer-Policy")) == (status, "no-referrer"), path
        connection.close()
