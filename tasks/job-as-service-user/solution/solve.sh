#!/bin/bash
# svc needs to read the settings (group-readable), and own its log and state folders.
runuser -u svc -- python3 /app/job.py
chgrp svc /etc/myapp/settings.ini
chmod 640 /etc/myapp/settings.ini
chown -R svc:svc /var/log/myapp /var/lib/myapp
runuser -u svc -- python3 /app/job.py
cat /var/lib/myapp/result.json
