#!/usr/bin/env bash
# Installs what the browser test of the built book (tests/test_browser.py) needs, where it is missing:
#   1. Debian's Chromium (apt-get, as root). GitHub's ubuntu runners already have /usr/bin/chromium.
#   2. MathJax 3, pinned and checksummed, from the npm registry (`npm pack`) into _build/mathjax/. The book loads
#      MathJax from its CDN (https://cdn.jsdelivr.net/npm/mathjax@3/...); the test has no network, so it answers those
#      requests with this copy -- same major version, so the pages are typeset as readers see them.
# Never fails the build: where something cannot be installed, the test that needs it is skipped and says why.
set -u
cd "$(dirname "$0")/.." || exit 0

MATHJAX_VERSION=3.2.2
# sha512 of mathjax-3.2.2.tgz as published on the npm registry (its `integrity` field, in hex)
MATHJAX_SHA512=06df9249553c7811b6ef30a155ec0e89c62ced7b1db78d2a9b8f94a47c97ee4d3f3bd36588f73ec7bee4d7f144b0fb2328f64626fb5164cd6f3be81e5b43a11b
MATHJAX_DIR=_build/mathjax

install_chromium() {
  if command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing Chromium for the browser test (apt-get)..."
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) 2>&1 \
        | tail -n 3; then
      command -v chromium >/dev/null 2>&1 && return 0
    fi
  fi
  echo "Chromium is not installed and could not be installed here: the browser test will be skipped."
}

sha512() {
  python3 -c 'import hashlib, sys; print(hashlib.sha512(open(sys.argv[1], "rb").read()).hexdigest())' "$1"
}

install_mathjax() {
  if [ -f "$MATHJAX_DIR/es5/tex-mml-chtml.js" ] \
      && [ "$(cat "$MATHJAX_DIR/VERSION" 2>/dev/null)" = "$MATHJAX_VERSION" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "npm is not installed: MathJax cannot be fetched, the browser test's math check will be skipped."
    return 0
  fi
  echo "Fetching MathJax $MATHJAX_VERSION for the browser test (npm pack)..."
  local tmp tarball
  tmp=$(mktemp -d)
  tarball="$tmp/mathjax-$MATHJAX_VERSION.tgz"
  if (cd "$tmp" && npm pack --silent "mathjax@$MATHJAX_VERSION" >/dev/null 2>&1) \
      && [ "$(sha512 "$tarball")" = "$MATHJAX_SHA512" ]; then
    rm -rf "$MATHJAX_DIR" && mkdir -p "$MATHJAX_DIR" \
      && tar -xzf "$tarball" -C "$MATHJAX_DIR" --strip-components=1 package/es5 package/LICENSE \
      && echo "$MATHJAX_VERSION" > "$MATHJAX_DIR/VERSION"
  else
    echo "Could not fetch MathJax $MATHJAX_VERSION (or its checksum differs):" \
      "the browser test's math check will be skipped."
  fi
  rm -rf "$tmp"
}

install_chromium
install_mathjax
exit 0
