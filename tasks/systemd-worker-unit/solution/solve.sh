#!/bin/bash
# Without systemctl, enabling = the [Install] section's WantedBy symlink in multi-user.target.wants/.
cat > /etc/systemd/system/queue-worker.service <<'UNIT'
[Unit]
Description=Queue worker for outgoing e-mails
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User=worker
Group=worker
WorkingDirectory=/opt/worker
EnvironmentFile=/etc/worker/worker.env
ExecStart=/usr/bin/python3 /opt/worker/worker.py --queue emails
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
mkdir -p /etc/systemd/system/multi-user.target.wants
ln -sf /etc/systemd/system/queue-worker.service /etc/systemd/system/multi-user.target.wants/queue-worker.service
ls -l /etc/systemd/system/multi-user.target.wants/
