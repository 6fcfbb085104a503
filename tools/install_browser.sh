#!/usr/bin/env bash
# Installs Debian's Chromium for the browser test (tests/test_browser.py) when it is missing.
# Never fails the build: where no browser can be installed, the browser test skips and says why.
set -u
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Chromium for the browser test (apt-get)..."
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) 2>&1 | tail -n 3; then
    command -v chromium >/dev/null 2>&1 && exit 0
  fi
fi
echo "Chromium is not installed and could not be installed here: the browser test will be skipped."
