"""Write a deterministic access log (combined log format) to stdout."""
import random

rng = random.Random(20240301)
ips = [f"10.0.{rng.randint(0, 3)}.{rng.randint(2, 250)}" for _ in range(25)]
paths = ["/", "/login", "/api/items", "/api/items/42", "/static/app.js", "/health", "/admin"]
statuses = ["200"] * 14 + ["301", "304", "404", "404", "500", "502", "403"]
for i in range(600):
    minute, second = divmod(i, 60)
    print(f'{rng.choice(ips)} - - [01/Mar/2024:10:{minute:02d}:{second:02d} +0000] '
          f'"{rng.choice(["GET", "GET", "POST"])} {rng.choice(paths)} HTTP/1.1" {rng.choice(statuses)} '
          f'{rng.randint(100, 9000)} "-" "curl/8.0"')
