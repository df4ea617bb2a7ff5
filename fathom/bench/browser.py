"""Headless Chromium (Debian's `chromium`, driven by selenium through Debian's `chromedriver`) for
the console's lab test and `fathom bench console`: a browser for a closed network that contacts
nothing but the pages it is sent to."""
from __future__ import annotations

import contextlib
import os
import tempfile

from fathom import programs

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1000")


@contextlib.contextmanager
def headless_chromium(page_load_timeout: float = 20):
    """A selenium Chrome driver on a fresh profile, its browser log kept (`get_log("browser")`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ["SE_OFFLINE"] = "true"       # selenium's manager must not look for drivers online
    programs.require("chromium", "chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = programs.path("chromium")
    with tempfile.TemporaryDirectory(prefix="fathom-chromium-") as profile:
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(programs.path("chromedriver")), options=options)
        driver.set_page_load_timeout(page_load_timeout)
        try:
            yield driver
        finally:
            driver.quit()
