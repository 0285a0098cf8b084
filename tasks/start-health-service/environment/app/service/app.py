"""Health service: GET /health -> {"status": "ok", "version": ..., "port": ...}.

Configuration: config.env next to this file (KEY=VALUE lines), keys PORT and DATA_DIR (a writable
folder where the service keeps its state). Runs in the foreground until killed.
"""
import http.server
import json
import os
import sys

VERSION = "2.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))


def load_config():
    path = os.path.join(HERE, "config.env")
    if not os.path.exists(path):
        sys.exit(f"health: missing configuration file {path} (see config.env.example)")
    cfg = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                cfg[key.strip()] = value.strip()
    for key in ("PORT", "DATA_DIR"):
        if key not in cfg:
            sys.exit(f"health: {key} is not set in {path}")
    return cfg


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/health":
            self.send_error(404)
            return
        body = json.dumps({"status": "ok", "version": VERSION, "port": self.server.server_port}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("health: " + fmt % args + "\n")


def main():
    cfg = load_config()
    state = os.path.join(cfg["DATA_DIR"], "health.state")
    with open(state, "w") as fh:  # fails when DATA_DIR does not exist
        fh.write(f"pid={os.getpid()}\n")
    server = http.server.ThreadingHTTPServer(("0.0.0.0", int(cfg["PORT"])), Handler)
    print(f"health {VERSION} listening on port {cfg['PORT']}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
