"""A tiny web app whose settings live in /workspace/config.json.

The file is read again on every request, so a change of the `config` cell
(which the sandbox node writes into the box) shows on the next page load,
without a restart. GET / is a page; GET /config is the settings as JSON.
"""
import html
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = "/workspace/config.json"
PORT = int(os.environ.get("PORT", "8000"))


def load():
    try:
        with open(CONFIG) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return {}, str(e)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        cfg, err = load()
        if self.path.rstrip("/") == "/config":
            body = json.dumps(cfg if err is None else {"error": err}).encode()
            ctype = "application/json"
        else:
            title = html.escape(str(cfg.get("title", "untitled")))
            message = html.escape(str(cfg.get("message", "")))
            color = html.escape(str(cfg.get("color", "black")))
            note = f"<p><b>config.json: {html.escape(err)}</b></p>" if err else ""
            body = (
                f"<!doctype html><title>{title}</title>"
                f'<h1 style="color:{color}">{title}</h1><p>{message}</p>{note}'
            ).encode()
            ctype = "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print(fmt % args, flush=True)


if __name__ == "__main__":
    print(f"serving on 127.0.0.1:{PORT}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
