#!/bin/bash
# Needs config.env with PORT=8080 and an existing DATA_DIR; start detached (setsid, output to a file).
cd /app/service
sed 's/^PORT=.*/PORT=8080/' config.env.example > config.env
mkdir -p /var/lib/health
setsid nohup python3 /app/service/app.py > /var/log/health.log 2>&1 < /dev/null &
for i in $(seq 50); do curl -fsS http://127.0.0.1:8080/health && break; sleep 0.2; done
