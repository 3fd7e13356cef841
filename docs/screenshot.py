#!/usr/bin/env python3
"""Pictures of a report: REPORT/index.html opened in headless chromium, the page from the top down to the end of
the latest run's charts (or down to HEIGHT pixels: the README's picture), saved as a PNG.

Usage: python docs/screenshot.py report/index.html docs/report.png            # the reports guide's picture
       python docs/screenshot.py report/index.html docs/report-top.png 1100   # the README's
"""
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

page, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
height = int(sys.argv[3]) if len(sys.argv) > 3 else None
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
    tab = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    tab.goto(page.as_uri())
    tab.wait_for_load_state("load")
    bottom = tab.evaluate("() => { const c = [...document.querySelectorAll('#latest div.chart')];"
                          " return c.length ? c[c.length - 1].getBoundingClientRect().bottom + window.scrollY"
                          " : document.body.scrollHeight; }")
    bottom = min(bottom + 10, height) if height else bottom + 10
    tab.screenshot(path=str(out), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": bottom})
    browser.close()
