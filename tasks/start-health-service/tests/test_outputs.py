"""Outcome checks: the service answers on 127.0.0.1:8080/health (it must already be running)."""
import json
import time
import urllib.request


def test_health_endpoint():
    last = None
    for _ in range(3):
        try:
            with urllib.request.urlopen("http://127.0.0.1:8080/health", timeout=3) as resp:
                data = json.loads(resp.read())
            break
        except OSError as e:
            last = e
            time.sleep(0.3)
    else:
        raise AssertionError(f"service not reachable on port 8080: {last}")
    assert data == {"status": "ok", "version": "2.1.0", "port": 8080}
