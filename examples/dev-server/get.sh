#!/bin/sh
# Fetch a page of the server from inside the box: sh get.sh [PATH]
exec python3 - "${1:-/}" <<'PY'
import os, sys, urllib.request
port = os.environ.get("PORT", "8000")
with urllib.request.urlopen(f"http://127.0.0.1:{port}{sys.argv[1]}", timeout=5) as r:
    print(r.read().decode())
PY
